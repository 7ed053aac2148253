//! Marian `.npz` models: a ZIP archive of `.npy` arrays as numpy's `savez` (stored) and
//! `savez_compressed` (deflate) write them, one array per item (`NAME.npy`), the config
//! as an int8 array `special:model.yml`.
//!
//! The archive is read from its central directory (numpy writes zip64 extra fields with
//! `force_zip64`, which Marian's cnpy, walking local headers, happens to survive), every
//! entry's CRC-32 is checked, and entries may not overlap (an overlapping archive is a
//! decompression bomb). Deflate is decoded here ([`inflate`]): no new dependency.
//! Like Marian's `loadItemsFromNpz`, a 1-D array of `n` values becomes shape `[1, n]`.
use crate::error::{Error, Result};

use super::{MarianItem, MarianType};

fn bad(what: impl std::fmt::Display) -> Error {
    Error::invalid_model(format!("npz: {what}"))
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at.checked_add(2)?)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at.checked_add(4)?)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at.checked_add(8)?)?.try_into().ok()?))
}

fn to_usize(v: u64, what: &str) -> Result<usize> {
    usize::try_from(v).map_err(|_| bad(format!("{what} {v} is too large")))
}

const EOCD: u32 = 0x0605_4b50;
const EOCD64: u32 = 0x0606_4b50;
const EOCD64_LOCATOR: u32 = 0x0706_4b50;
const CENTRAL: u32 = 0x0201_4b50;
const LOCAL: u32 = 0x0403_4b50;
/// Deflate cannot expand more than 1032:1; a larger claimed size is a lie.
const MAX_DEFLATE_RATIO: u64 = 1032;

struct Entry {
    name: String,
    method: u16,
    crc: u32,
    compressed: u64,
    size: u64,
    local: u64,
}

/// The arrays of an `.npz`: their values copied (decompressed) into one buffer, each
/// 64-byte aligned, and the items locating them there.
pub fn parse(bytes: &[u8]) -> Result<(Vec<u8>, Vec<MarianItem>)> {
    let mut entries = central_directory(bytes)?;
    // Locate each entry's data and refuse overlaps.
    let mut spans = Vec::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        let local = to_usize(e.local, "a local header offset")?;
        if u32_at(bytes, local) != Some(LOCAL) {
            return Err(bad(format!("{}: no local header at offset {local}", e.name)));
        }
        let name_len = u16_at(bytes, local + 26).ok_or_else(|| bad("truncated local header"))?;
        let extra_len = u16_at(bytes, local + 28).ok_or_else(|| bad("truncated local header"))?;
        let start = local + 30 + usize::from(name_len) + usize::from(extra_len);
        let end = to_usize(e.compressed, "a compressed size")?
            .checked_add(start)
            .filter(|&end| end <= bytes.len())
            .ok_or_else(|| bad(format!("{}: its data runs past the end of the archive", e.name)))?;
        spans.push((local, start, end, i));
    }
    spans.sort_unstable();
    if let Some(w) = spans.windows(2).find(|w| w[1].0 < w[0].2) {
        return Err(bad(format!("the entries {} and {} overlap", entries[w[0].3].name, entries[w[1].3].name)));
    }
    spans.sort_unstable_by_key(|s| s.3);

    let mut data = Vec::new();
    let mut items = Vec::with_capacity(entries.len());
    for (e, &(_, start, end, _)) in entries.iter_mut().zip(&spans) {
        let raw = &bytes[start..end];
        let size = to_usize(e.size, "an uncompressed size")?;
        let name = std::mem::take(&mut e.name);
        let inflated;
        let npy = match e.method {
            0 if raw.len() == size => raw,
            0 => return Err(bad(format!("{name}: stored entry of {} bytes claims {size}", raw.len()))),
            8 => {
                if e.size > (raw.len() as u64).saturating_mul(MAX_DEFLATE_RATIO).saturating_add(1024) {
                    return Err(bad(format!("{name}: {size} bytes cannot come from {} compressed bytes", raw.len())));
                }
                inflated = inflate(raw, size).map_err(|err| bad(format!("{name}: {}", err.message)))?;
                &inflated[..]
            }
            m => {
                return Err(Error::unsupported(format!(
                    "npz: {name} is compressed with ZIP method {m} (only stored and deflate are supported)"
                )))
            }
        };
        if crc32(npy) != e.crc {
            return Err(bad(format!("{name}: CRC-32 mismatch (corrupted archive)")));
        }
        let Some(item_name) = name.strip_suffix(".npy") else {
            return Err(bad(format!("the entry {name} is not a .npy array")));
        };
        let (item_type, shape, values) =
            npy_array(npy).map_err(|err| Error::new(err.kind, format!("npz: {name}: {}", err.message)))?;
        data.resize(data.len().next_multiple_of(64), 0);
        let offset = data.len();
        data.extend_from_slice(values);
        items.push(MarianItem::new(item_name.to_string(), shape, item_type, offset, values.len())?);
    }
    Ok((data, items))
}

fn central_directory(bytes: &[u8]) -> Result<Vec<Entry>> {
    // The end-of-central-directory record: 22 bytes plus a comment of up to 65535.
    let lowest = bytes.len().saturating_sub(22 + 65535);
    let eocd = (lowest..=bytes.len().saturating_sub(22))
        .rev()
        .find(|&at| u32_at(bytes, at) == Some(EOCD))
        .ok_or_else(|| bad("no end of central directory (not a ZIP archive, or truncated)"))?;
    let field16 = |off| u16_at(bytes, eocd + off).map(u64::from).ok_or_else(|| bad("truncated end record"));
    let field32 = |off| u32_at(bytes, eocd + off).map(u64::from).ok_or_else(|| bad("truncated end record"));
    let (mut count, mut cd_size, mut cd_offset) = (field16(10)?, field32(12)?, field32(16)?);
    if count == 0xffff || cd_size == 0xffff_ffff || cd_offset == 0xffff_ffff {
        // zip64: the locator just before the record points at the zip64 end record.
        let locator = eocd.checked_sub(20).filter(|&at| u32_at(bytes, at) == Some(EOCD64_LOCATOR));
        let record = locator.and_then(|at| u64_at(bytes, at + 8)).and_then(|r| usize::try_from(r).ok());
        let record = record
            .filter(|&r| u32_at(bytes, r) == Some(EOCD64))
            .ok_or_else(|| bad("a zip64 archive without its zip64 end record"))?;
        let get = |off| u64_at(bytes, record + off).ok_or_else(|| bad("truncated zip64 end record"));
        (count, cd_size, cd_offset) = (get(32)?, get(40)?, get(48)?);
    }
    let start = to_usize(cd_offset, "the central directory offset")?;
    let cd = to_usize(cd_size, "the central directory size")?
        .checked_add(start)
        .and_then(|end| bytes.get(start..end))
        .ok_or_else(|| bad("the central directory lies past the end of the archive"))?;
    // Every central header takes at least 46 bytes: a count beyond that is a lie.
    if count > (cd.len() / 46) as u64 {
        return Err(bad(format!("{count} entries do not fit in a {}-byte central directory", cd.len())));
    }
    let mut entries = Vec::with_capacity(count as usize);
    let mut at = 0usize;
    for _ in 0..count {
        let h = cd
            .get(at..at + 46)
            .filter(|h| u32_at(h, 0) == Some(CENTRAL))
            .ok_or_else(|| bad("bad central directory header"))?;
        let flags = u16_at(h, 8).unwrap_or_default();
        let method = u16_at(h, 10).unwrap_or_default();
        let crc = u32_at(h, 16).unwrap_or_default();
        let mut compressed = u64::from(u32_at(h, 20).unwrap_or_default());
        let mut size = u64::from(u32_at(h, 24).unwrap_or_default());
        let name_len = usize::from(u16_at(h, 28).unwrap_or_default());
        let extra_len = usize::from(u16_at(h, 30).unwrap_or_default());
        let comment_len = usize::from(u16_at(h, 32).unwrap_or_default());
        let mut local = u64::from(u32_at(h, 42).unwrap_or_default());
        let name = cd.get(at + 46..at + 46 + name_len).ok_or_else(|| bad("truncated central directory"))?;
        let name = std::str::from_utf8(name).map_err(|_| bad("an entry name is not valid UTF-8"))?.to_string();
        let extra_at = at + 46 + name_len;
        let extra = cd.get(extra_at..extra_at + extra_len).ok_or_else(|| bad("truncated central directory"))?;
        if flags & 1 != 0 {
            return Err(Error::unsupported(format!("npz: {name} is encrypted")));
        }
        // zip64 extended information: the 64-bit values of the fields saturated above.
        let mut e = 0;
        while let (Some(id), Some(len)) = (u16_at(extra, e), u16_at(extra, e + 2)) {
            let field = extra
                .get(e + 4..e + 4 + usize::from(len))
                .ok_or_else(|| bad(format!("{name}: truncated extra field")))?;
            if id == 1 {
                let mut values = field.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")));
                for v in [&mut size, &mut compressed, &mut local] {
                    if *v == 0xffff_ffff {
                        *v = values.next().ok_or_else(|| bad(format!("{name}: short zip64 extra field")))?;
                    }
                }
            }
            e += 4 + usize::from(len);
        }
        entries.push(Entry { name, method, crc, compressed, size, local });
        at = extra_at + extra_len + comment_len;
    }
    Ok(entries)
}

/// An error inside one array (the caller adds the archive and entry names).
fn npy_bad(what: impl std::fmt::Display) -> Error {
    Error::invalid_model(what.to_string())
}

/// A `.npy` array: its type, shape (1-D as `[1, n]`) and values.
fn npy_array(b: &[u8]) -> Result<(MarianType, Vec<usize>, &[u8])> {
    if !b.starts_with(b"\x93NUMPY") || b.len() < 10 {
        return Err(npy_bad("not a .npy array (bad magic)"));
    }
    let (header_len, header_at) = match b[6] {
        1 => (u16_at(b, 8).map(usize::from), 10usize),
        2 | 3 => (u32_at(b, 8).and_then(|v| usize::try_from(v).ok()), 12),
        v => return Err(npy_bad(format!(".npy version {v} is not supported"))),
    };
    let header = header_len
        .and_then(|l| b.get(header_at..header_at.checked_add(l)?))
        .ok_or_else(|| npy_bad("truncated .npy header"))?;
    let values = &b[header_at + header.len()..];
    let header = std::str::from_utf8(header).map_err(|_| npy_bad("the .npy header is not text"))?;
    let dict = PyLit::parse(header)?;
    let PyLit::Dict(entries) = dict else { return Err(npy_bad("the .npy header is not a dict")) };
    let field = |key: &str| entries.iter().find(|(k, _)| k == key).map(|(_, v)| v);
    let descr = match field("descr") {
        Some(PyLit::Str(s)) => s.as_str(),
        Some(_) => return Err(Error::unsupported("structured dtypes are not supported")),
        None => return Err(npy_bad("the .npy header has no 'descr'")),
    };
    if !matches!(field("fortran_order"), Some(PyLit::Bool(false))) {
        return Err(Error::unsupported("Fortran-ordered arrays are not supported"));
    }
    let Some(PyLit::Tuple(dims)) = field("shape") else { return Err(npy_bad("the .npy header has no shape tuple")) };
    let mut shape = dims
        .iter()
        .map(|d| match d {
            PyLit::Int(v) => to_usize(*v, "a dimension"),
            _ => Err(npy_bad("a dimension is not an integer")),
        })
        .collect::<Result<Vec<usize>>>()?;
    if shape.len() == 1 {
        shape.insert(0, 1);
    }
    let item_type = npy_type(descr)?;
    let expected = shape.iter().try_fold(item_type.element_size(), |n, &d| n.checked_mul(d));
    if expected != Some(values.len()) {
        return Err(npy_bad(format!("{} bytes of values for shape {shape:?} of {descr}", values.len())));
    }
    Ok((item_type, shape, values))
}

/// A numpy dtype string (`<f4`, `|i1`, ...) as a Marian type; little-endian only.
fn npy_type(descr: &str) -> Result<MarianType> {
    use MarianType::*;
    let (order, kind) = descr.split_at(descr.len().min(1));
    let t = match kind {
        "f2" => Float16,
        "f4" => Float32,
        "f8" => Float64,
        "i1" | "b" => Int8,
        "i2" => Int16,
        "i4" => Int32,
        "i8" => Int64,
        "u1" | "B" => Uint8,
        "u2" => Uint16,
        "u4" => Uint32,
        "u8" => Uint64,
        _ => return Err(Error::unsupported(format!("dtype {descr:?} is not supported"))),
    };
    match order {
        "<" | "|" | "=" => Ok(t),
        ">" if t.element_size() == 1 => Ok(t),
        _ => Err(Error::unsupported(format!("dtype {descr:?} is not little-endian"))),
    }
}

/// The Python literals of a `.npy` header.
#[derive(Debug, PartialEq)]
enum PyLit {
    Str(String),
    Bool(bool),
    Int(u64),
    Tuple(Vec<PyLit>),
    Dict(Vec<(String, PyLit)>),
}

impl PyLit {
    fn parse(text: &str) -> Result<PyLit> {
        let mut p = (text.as_bytes(), 0usize);
        let v = Self::value(&mut p, 0)?;
        Self::blanks(&mut p);
        if p.1 != p.0.len() {
            return Err(npy_bad("trailing text in the .npy header"));
        }
        Ok(v)
    }

    fn blanks(p: &mut (&[u8], usize)) {
        while p.0.get(p.1).is_some_and(|c| c.is_ascii_whitespace()) {
            p.1 += 1;
        }
    }

    fn eat(p: &mut (&[u8], usize), c: u8) -> bool {
        Self::blanks(p);
        let hit = p.0.get(p.1) == Some(&c);
        p.1 += usize::from(hit);
        hit
    }

    fn value(p: &mut (&[u8], usize), depth: usize) -> Result<PyLit> {
        if depth > 8 {
            return Err(npy_bad("the .npy header nests too deep"));
        }
        Self::blanks(p);
        let (b, at) = (p.0, p.1);
        match b.get(at) {
            Some(&q @ (b'\'' | b'"')) => {
                let len = b[at + 1..]
                    .iter()
                    .position(|&c| c == q)
                    .ok_or_else(|| npy_bad("unterminated string in the .npy header"))?;
                p.1 = at + 2 + len;
                Ok(PyLit::Str(String::from_utf8_lossy(&b[at + 1..at + 1 + len]).into_owned()))
            }
            Some(&open @ (b'(' | b'[' | b'{')) => {
                p.1 += 1;
                let close = match open {
                    b'(' => b')',
                    b'[' => b']',
                    _ => b'}',
                };
                let (mut items, mut entries) = (Vec::new(), Vec::new());
                loop {
                    if Self::eat(p, close) {
                        break;
                    }
                    let v = Self::value(p, depth + 1)?;
                    if open == b'{' {
                        let PyLit::Str(k) = v else { return Err(npy_bad("a .npy header key is not a string")) };
                        if !Self::eat(p, b':') {
                            return Err(npy_bad("expected ':' in the .npy header"));
                        }
                        entries.push((k, Self::value(p, depth + 1)?));
                    } else {
                        items.push(v);
                    }
                    if Self::eat(p, b',') {
                        continue;
                    }
                    if Self::eat(p, close) {
                        break;
                    }
                    return Err(npy_bad("expected ',' in the .npy header"));
                }
                Ok(if open == b'{' { PyLit::Dict(entries) } else { PyLit::Tuple(items) })
            }
            _ => {
                let len = b[at..].iter().position(|c| !c.is_ascii_alphanumeric()).unwrap_or(b.len() - at);
                let word = &b[at..at + len];
                p.1 = at + len;
                match word {
                    b"True" => Ok(PyLit::Bool(true)),
                    b"False" => Ok(PyLit::Bool(false)),
                    _ => {
                        // Python 2 wrote long dimensions as `3L`.
                        let digits = word.strip_suffix(b"L").unwrap_or(word);
                        std::str::from_utf8(digits)
                            .ok()
                            .filter(|d| !d.is_empty() && d.bytes().all(|c| c.is_ascii_digit()))
                            .and_then(|d| d.parse().ok())
                            .map(PyLit::Int)
                            .ok_or_else(|| npy_bad("unexpected text in the .npy header"))
                    }
                }
            }
        }
    }
}

/// CRC-32 (IEEE, as ZIP uses it).
pub fn crc32(data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut t = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 { 0xedb8_8320 ^ (c >> 1) } else { c >> 1 };
                k += 1;
            }
            t[i] = c;
            i += 1;
        }
        t
    };
    !data.iter().fold(!0u32, |c, &b| TABLE[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8))
}

/// Decodes a raw deflate stream (RFC 1951) that must produce exactly `size` bytes.
pub fn inflate(input: &[u8], size: usize) -> Result<Vec<u8>> {
    inflate::run(input, size).map_err(|what| Error::invalid_model(format!("deflate: {what}")))
}

mod inflate {
    type R<T> = std::result::Result<T, &'static str>;

    const LENGTH_BASE: [u16; 29] = [
        3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227,
        258,
    ];
    const LENGTH_EXTRA: [u8; 29] =
        [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0];
    const DIST_BASE: [u16; 30] = [
        1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097,
        6145, 8193, 12289, 16385, 24577,
    ];
    const DIST_EXTRA: [u8; 30] =
        [0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13];
    const CODE_LENGTH_ORDER: [usize; 19] = [16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15];

    /// LSB-first bits of the input.
    struct Bits<'a> {
        data: &'a [u8],
        pos: usize,
        buf: u64,
        count: u32,
    }

    impl Bits<'_> {
        fn fill(&mut self) {
            while self.count <= 56 && self.pos < self.data.len() {
                self.buf |= u64::from(self.data[self.pos]) << self.count;
                self.pos += 1;
                self.count += 8;
            }
        }

        /// The next `n` bits (missing ones at the end of the input read as zero).
        fn peek(&mut self, n: u32) -> u32 {
            self.fill();
            (self.buf & ((1u64 << n) - 1)) as u32
        }

        fn consume(&mut self, n: u32) -> R<()> {
            if n > self.count {
                return Err("truncated stream");
            }
            self.buf >>= n;
            self.count -= n;
            Ok(())
        }

        fn take(&mut self, n: u32) -> R<u32> {
            let v = self.peek(n);
            self.consume(n)?;
            Ok(v)
        }
    }

    /// A canonical Huffman code as a table indexed by the next `bits` input bits.
    struct Huffman {
        /// (symbol, code length); length 0 marks a bit pattern no code starts with.
        table: Vec<(u16, u8)>,
        bits: u32,
    }

    impl Huffman {
        fn new(lengths: &[u8]) -> R<Huffman> {
            let bits = u32::from(lengths.iter().copied().max().unwrap_or(0));
            let mut count = [0u32; 16];
            for &l in lengths {
                count[usize::from(l)] += 1;
            }
            let mut left: i64 = 1;
            for &c in &count[1..] {
                left = 2 * left - i64::from(c);
                if left < 0 {
                    return Err("over-subscribed Huffman code");
                }
            }
            let mut next = [0u32; 16];
            for l in 2..16 {
                next[l] = (next[l - 1] + count[l - 1]) << 1;
            }
            let mut table = vec![(0u16, 0u8); 1 << bits];
            for (symbol, &l) in lengths.iter().enumerate() {
                if l == 0 {
                    continue;
                }
                let code = next[usize::from(l)];
                next[usize::from(l)] += 1;
                let reversed = (code.reverse_bits() >> (32 - u32::from(l))) as usize;
                for slot in table.iter_mut().skip(reversed).step_by(1 << l) {
                    *slot = (symbol as u16, l);
                }
            }
            Ok(Huffman { table, bits })
        }

        fn decode(&self, input: &mut Bits) -> R<u16> {
            let (symbol, len) = self.table.get(input.peek(self.bits) as usize).copied().unwrap_or_default();
            if len == 0 {
                return Err("invalid Huffman code");
            }
            input.consume(u32::from(len))?;
            Ok(symbol)
        }
    }

    pub(super) fn run(input: &[u8], size: usize) -> R<Vec<u8>> {
        let mut bits = Bits { data: input, pos: 0, buf: 0, count: 0 };
        let mut out = Vec::with_capacity(size.min(1 << 24));
        loop {
            let last = bits.take(1)?;
            match bits.take(2)? {
                0 => stored(&mut bits, &mut out, size)?,
                1 => {
                    let mut lengths = [8u8; 288];
                    lengths[144..256].fill(9);
                    lengths[256..280].fill(7);
                    codes(&mut bits, &mut out, size, &Huffman::new(&lengths)?, &Huffman::new(&[5; 32])?)?
                }
                2 => {
                    let (lit, dist) = dynamic(&mut bits)?;
                    codes(&mut bits, &mut out, size, &lit, &dist)?
                }
                _ => return Err("invalid block type"),
            }
            if last == 1 {
                break;
            }
        }
        if out.len() != size {
            return Err("the stream ends before the stated size");
        }
        Ok(out)
    }

    fn stored(bits: &mut Bits, out: &mut Vec<u8>, size: usize) -> R<()> {
        bits.consume(bits.count % 8)?;
        let len = bits.take(16)?;
        if bits.take(16)? != !len & 0xffff {
            return Err("stored block length check failed");
        }
        let len = len as usize;
        if out.len() + len > size {
            return Err("more data than the stated size");
        }
        // Whole bytes still in the bit buffer first, then straight from the input.
        let mut left = len;
        while left > 0 && bits.count >= 8 {
            out.push(bits.take(8)? as u8);
            left -= 1;
        }
        let chunk = bits.data.get(bits.pos..bits.pos + left).ok_or("truncated stored block")?;
        out.extend_from_slice(chunk);
        bits.pos += left;
        Ok(())
    }

    fn dynamic(bits: &mut Bits) -> R<(Huffman, Huffman)> {
        let hlit = bits.take(5)? as usize + 257;
        let hdist = bits.take(5)? as usize + 1;
        let hclen = bits.take(4)? as usize + 4;
        if hlit > 286 || hdist > 30 {
            return Err("too many length or distance codes");
        }
        let mut cl = [0u8; 19];
        for &i in &CODE_LENGTH_ORDER[..hclen] {
            cl[i] = bits.take(3)? as u8;
        }
        let cl = Huffman::new(&cl)?;
        let mut lengths = [0u8; 286 + 30];
        let mut n = 0;
        while n < hlit + hdist {
            let (value, repeat) = match cl.decode(bits)? {
                s @ 0..=15 => (s as u8, 1),
                16 if n > 0 => (lengths[n - 1], 3 + bits.take(2)? as usize),
                16 => return Err("a repeat with no previous length"),
                17 => (0, 3 + bits.take(3)? as usize),
                _ => (0, 11 + bits.take(7)? as usize),
            };
            if n + repeat > hlit + hdist {
                return Err("code lengths overflow");
            }
            lengths[n..n + repeat].fill(value);
            n += repeat;
        }
        if lengths[256] == 0 {
            return Err("no end-of-block code");
        }
        Ok((Huffman::new(&lengths[..hlit])?, Huffman::new(&lengths[hlit..hlit + hdist])?))
    }

    fn codes(bits: &mut Bits, out: &mut Vec<u8>, size: usize, lit: &Huffman, dist: &Huffman) -> R<()> {
        loop {
            let symbol = lit.decode(bits)? as usize;
            if symbol < 256 {
                if out.len() >= size {
                    return Err("more data than the stated size");
                }
                out.push(symbol as u8);
                continue;
            }
            if symbol == 256 {
                return Ok(());
            }
            let i = symbol - 257;
            if i >= 29 {
                return Err("invalid length code");
            }
            let len = usize::from(LENGTH_BASE[i]) + bits.take(u32::from(LENGTH_EXTRA[i]))? as usize;
            let d = dist.decode(bits)? as usize;
            if d >= 30 {
                return Err("invalid distance code");
            }
            let distance = usize::from(DIST_BASE[d]) + bits.take(u32::from(DIST_EXTRA[d]))? as usize;
            if distance > out.len() {
                return Err("a distance before the start of the output");
            }
            if out.len() + len > size {
                return Err("more data than the stated size");
            }
            let from = out.len() - distance;
            if distance >= len {
                out.extend_from_within(from..from + len);
            } else {
                for k in 0..len {
                    out.push(out[from + k]);
                }
            }
        }
    }
}
