//! Marian's binary model format (`src/common/binary.cpp`, `BINARY_FILE_VERSION = 1`):
//!
//! ```text
//! u64 version (1; 2 is marian-nmt's encrypted header)
//! u64 n
//! n x { u64 nameLength, u64 type, u64 shapeLength, u64 dataLength }
//! n names, NUL-terminated (nameLength counts the NUL)
//! n shapes, shapeLength int32 each
//! u64 padding, then that many zero bytes (the data starts 256-aligned)
//! n data blobs of dataLength bytes, one after the other
//! ```
//!
//! `dataLength` includes each blob's padding to 256 bytes (so every blob starts
//! 256-aligned when the previous ones are padded) and an intgemm item's quantMult.
//! Marian trusts every field; here every size and offset is checked against the file.
use crate::error::{Error, Result};

use super::{MarianItem, MarianType};

const HEADER_BYTES: usize = 32;

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: u64, what: &dyn Fn() -> String) -> Result<(usize, &'a [u8])> {
        let start = self.at;
        let end = usize::try_from(len).ok().and_then(|l| start.checked_add(l)).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(Error::invalid_model(format!(
                "Marian model: {} ({len} bytes at offset {start}) runs past the end of the {}-byte file",
                what(),
                self.bytes.len()
            )));
        };
        self.at = end;
        Ok((start, &self.bytes[start..end]))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        let (_, b) = self.take(8, &|| what.to_string())?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }
}

/// The items of a `.bin` file, their values located in `bytes`.
pub fn parse(bytes: &[u8]) -> Result<Vec<MarianItem>> {
    let mut r = Reader { bytes, at: 0 };
    match r.u64("the version")? {
        1 => {}
        2 => return Err(Error::unsupported("Marian model: encrypted models (binary version 2) are not supported")),
        v => return Err(Error::invalid_model(format!("Marian model: unknown binary version {v} (expected 1)"))),
    }
    let n = r.u64("the item count")?;
    let header_bytes = n.saturating_mul(HEADER_BYTES as u64);
    let (_, headers) = r.take(header_bytes, &|| format!("the headers of {n} items"))?;
    let headers: Vec<[u64; 4]> = headers
        .chunks_exact(HEADER_BYTES)
        .map(|h| std::array::from_fn(|i| u64::from_le_bytes(h[8 * i..8 * i + 8].try_into().expect("8 bytes"))))
        .collect();

    let mut names = Vec::with_capacity(headers.len());
    for (i, h) in headers.iter().enumerate() {
        let (_, raw) = r.take(h[0], &|| format!("the name of item {i}"))?;
        // Marian reads the name as a C string: up to the first NUL, which must be there.
        let Some(nul) = raw.iter().position(|&b| b == 0) else {
            return Err(Error::invalid_model(format!("Marian model: the name of item {i} is not NUL-terminated")));
        };
        let name = std::str::from_utf8(&raw[..nul])
            .map_err(|_| Error::invalid_model(format!("Marian model: the name of item {i} is not valid UTF-8")))?;
        names.push(name.to_string());
    }

    let mut shapes = Vec::with_capacity(headers.len());
    for (h, name) in headers.iter().zip(&names) {
        let len = h[2].saturating_mul(4);
        let (_, raw) = r.take(len, &|| format!("the shape of {name}"))?;
        let shape = raw
            .chunks_exact(4)
            .map(|d| {
                let d = i32::from_le_bytes(d.try_into().expect("4 bytes"));
                usize::try_from(d)
                    .map_err(|_| Error::invalid_model(format!("Marian model: {name} has a negative dimension {d}")))
            })
            .collect::<Result<Vec<usize>>>()?;
        shapes.push(shape);
    }

    let padding = r.u64("the padding length")?;
    r.take(padding, &|| "the padding before the data".to_string())?;

    let mut items = Vec::with_capacity(headers.len());
    for ((h, name), shape) in headers.iter().zip(names).zip(shapes) {
        let item_type = MarianType::from_code(h[1], &name)?;
        let (offset, data) = r.take(h[3], &|| format!("the data of {name}"))?;
        items.push(MarianItem::new(name, shape, item_type, offset, data.len())?);
    }
    Ok(items)
}
