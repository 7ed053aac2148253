//! Marian model files (`.bin`, `.npz`) and their YAML configuration.
//!
//! [`MarianFile`] holds the named items of a model as Marian stores them: shapes as
//! written (Marian writes vectors as `1 x n`; npz vectors are read as `1 x n` as Marian's
//! `loadItemsFromNpz` does), values unconverted. Building layers from them is `model`'s
//! job; this module only guarantees every item's bytes lie inside the file.
//!
//! Item types are Marian's `Type` codes (`src/common/types.h`): the low byte is the
//! element size, the rest a class (signed 0x100, unsigned 0x200, float 0x400, packed
//! 0x800, avx2 0x1000, avx512 0x2000). The two Marian lineages disagree on intgemm:
//! browsermt/marian-dev (what Bergamot models are written with) has
//! `intgemm_type = 0x4000` and `intgemm8 = 0x4101`, `intgemm16 = 0x4102`; marian-nmt
//! master has `sse2 = 0x4000, ssse3 = 0x8000, intgemm_type = 0x10000`, `intgemm8 =
//! 0x10001`, `intgemm16 = 0x10002` plus CPU-prepacked intgemm variants. Both plain
//! encodings are read; CPU-prepacked layouts (FBGEMM `packed16` 0x802, `packed8avx2`
//! 0x1801, `packed8avx512` 0x2801, master's `intgemm8avx2` 0x11001 etc.) are refused
//! at load by name.
//!
//! intgemm items (browsermt `src/tensors/cpu/expression_graph_packable.h`): `rows*cols`
//! int8 (int16) values followed by one float32 quantMult (`127/max|w|` for int8, 1024 for
//! int16), then padding. Weights named `*_W*` are stored transposed (the shape is not
//! updated); `Wemb` is not transposed and is dequantized to float32 at load
//! (`value * (1/quantMult)`, `unquantizeWemb` in `src/tensors/cpu/integer_common.h`,
//! called from `src/common/binary.cpp` for every intgemm item whose name contains
//! `Wemb`).
pub mod bin;
pub mod npz;
pub mod yaml;

use std::collections::HashMap;
use std::path::Path;

use crate::error::{Error, Result};
use crate::format::files::{FileBytes, PackageFiles};
pub use yaml::Yaml;

/// The name of the item holding the model's YAML configuration.
pub const MODEL_YML: &str = "special:model.yml";

/// The element type of a Marian item (the types Tolk reads; prepacked ones are refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MarianType {
    Int8,
    Int16,
    Int32,
    Int64,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    Float16,
    Float32,
    Float64,
    /// int8 values plus an appended float32 quantMult.
    Intgemm8,
    /// int16 values plus an appended float32 quantMult.
    Intgemm16,
}

/// Every type code Marian (either lineage) defines, by its Marian name.
const TYPE_NAMES: &[(u64, &str)] = &[
    (0x101, "int8"),
    (0x102, "int16"),
    (0x104, "int32"),
    (0x108, "int64"),
    (0x201, "uint8"),
    (0x202, "uint16"),
    (0x204, "uint32"),
    (0x208, "uint64"),
    (0x402, "float16"),
    (0x404, "float32"),
    (0x408, "float64"),
    (0x4101, "intgemm8"),
    (0x4102, "intgemm16"),
    (0x10001, "intgemm8"),
    (0x10002, "intgemm16"),
    (0x802, "packed16"),
    (0x1801, "packed8avx2"),
    (0x2801, "packed8avx512"),
    (0x18001, "intgemm8ssse3"),
    (0x11001, "intgemm8avx2"),
    (0x12001, "intgemm8avx512"),
    (0x13001, "intgemm8avx512vnni"),
    (0x14002, "intgemm16sse2"),
    (0x11002, "intgemm16avx2"),
    (0x12002, "intgemm16avx512"),
];

/// Marian's name of a type code (`None` for codes Marian does not define).
pub fn type_name(code: u64) -> Option<&'static str> {
    TYPE_NAMES.iter().find(|(c, _)| *c == code).map(|(_, n)| *n)
}

impl MarianType {
    /// The type of item `item` from its code; prepacked and unknown codes are errors
    /// that name the item and the type.
    pub fn from_code(code: u64, item: &str) -> Result<MarianType> {
        use MarianType::*;
        Ok(match code {
            0x101 => Int8,
            0x102 => Int16,
            0x104 => Int32,
            0x108 => Int64,
            0x201 => Uint8,
            0x202 => Uint16,
            0x204 => Uint32,
            0x208 => Uint64,
            0x402 => Float16,
            0x404 => Float32,
            0x408 => Float64,
            0x4101 | 0x10001 => Intgemm8,
            0x4102 | 0x10002 => Intgemm16,
            _ => {
                return Err(match type_name(code) {
                    Some(name) => Error::unsupported(format!(
                        "{item} is stored as {name} (a CPU-specific prepacked layout); convert the model to intgemm8 or float32"
                    )),
                    None => Error::invalid_model(format!("{item} has an unknown Marian type code {code:#x}")),
                })
            }
        })
    }

    /// Marian's name of the type.
    pub fn name(self) -> &'static str {
        use MarianType::*;
        match self {
            Int8 => "int8",
            Int16 => "int16",
            Int32 => "int32",
            Int64 => "int64",
            Uint8 => "uint8",
            Uint16 => "uint16",
            Uint32 => "uint32",
            Uint64 => "uint64",
            Float16 => "float16",
            Float32 => "float32",
            Float64 => "float64",
            Intgemm8 => "intgemm8",
            Intgemm16 => "intgemm16",
        }
    }

    /// Bytes per element (the quantMult of intgemm types not counted).
    pub fn element_size(self) -> usize {
        use MarianType::*;
        match self {
            Int8 | Uint8 | Intgemm8 => 1,
            Int16 | Uint16 | Float16 | Intgemm16 => 2,
            Int32 | Uint32 | Float32 => 4,
            Int64 | Uint64 | Float64 => 8,
        }
    }

    pub fn is_intgemm(self) -> bool {
        matches!(self, MarianType::Intgemm8 | MarianType::Intgemm16)
    }
}

/// One named item of a Marian model.
#[derive(Debug, Clone, PartialEq)]
pub struct MarianItem {
    pub name: String,
    /// As stored (a `.bin` vector is usually `[1, n]`).
    pub shape: Vec<usize>,
    pub item_type: MarianType,
    elements: usize,
    /// Where the values start in the file's backing bytes, and their length.
    offset: usize,
    len: usize,
}

impl MarianItem {
    /// An item whose values start at `offset` with `available` bytes stored there
    /// (values, intgemm quantMult and padding); errors when they do not fit.
    pub(crate) fn new(
        name: String,
        shape: Vec<usize>,
        item_type: MarianType,
        offset: usize,
        available: usize,
    ) -> Result<MarianItem> {
        let elements = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .ok_or_else(|| Error::invalid_model(format!("{name}: the shape {shape:?} is too large")))?;
        let len = elements.checked_mul(item_type.element_size());
        let needed = len.and_then(|l| l.checked_add(if item_type.is_intgemm() { 4 } else { 0 }));
        match (len, needed) {
            (Some(len), Some(needed)) if needed <= available => {
                Ok(MarianItem { name, shape, item_type, elements, offset, len })
            }
            _ => Err(Error::invalid_model(format!(
                "{name}: {} values of shape {shape:?} do not fit in its {available} stored bytes",
                item_type.name()
            ))),
        }
    }

    /// The number of values (the product of the shape).
    pub fn elements(&self) -> usize {
        self.elements
    }

    /// The size of the values in bytes (without quantMult or padding).
    pub fn num_bytes(&self) -> usize {
        self.len
    }
}

enum Backing {
    /// A `.bin` file, mapped (or in memory).
    Map(FileBytes),
    /// `from_bytes` input, or the arrays of an `.npz` (decompressed, 64-byte aligned).
    Heap(Vec<u8>),
}

/// A Marian model file: its items by name over the file's bytes.
pub struct MarianFile {
    data: Backing,
    items: Vec<MarianItem>,
    index: HashMap<String, usize>,
}

fn is_zip(bytes: &[u8]) -> bool {
    bytes.starts_with(b"PK\x03\x04") || bytes.starts_with(b"PK\x05\x06")
}

impl MarianFile {
    /// Opens a `.bin` (mapped) or `.npz` (read and decompressed), told apart by the
    /// ZIP magic, not the file name.
    pub fn open(path: &Path) -> Result<MarianFile> {
        MarianFile::open_in(&PackageFiles::Disk, path)
    }

    /// [`MarianFile::open`] for a file of `files` (on disk or in memory).
    pub fn open_in(files: &PackageFiles, path: &Path) -> Result<MarianFile> {
        let map = files.map(path)?;
        if map.is_empty() {
            return Err(Error::invalid_model(format!("{} is empty", path.display())));
        }
        let at = |e: Error| Error::new(e.kind, format!("{}: {}", path.display(), e.message));
        if is_zip(&map) {
            let (data, items) = npz::parse(&map).map_err(at)?;
            Self::build(Backing::Heap(data), items).map_err(at)
        } else {
            let items = bin::parse(&map).map_err(at)?;
            Self::build(Backing::Map(map), items).map_err(at)
        }
    }

    /// Parses a `.bin` or `.npz` held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<MarianFile> {
        if is_zip(&bytes) {
            let (data, items) = npz::parse(&bytes)?;
            Self::build(Backing::Heap(data), items)
        } else {
            let items = bin::parse(&bytes)?;
            Self::build(Backing::Heap(bytes), items)
        }
    }

    fn build(data: Backing, items: Vec<MarianItem>) -> Result<MarianFile> {
        let mut index = HashMap::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            if index.insert(item.name.clone(), i).is_some() {
                return Err(Error::invalid_model(format!("the item {} appears twice", item.name)));
            }
        }
        Ok(MarianFile { data, items, index })
    }

    fn data(&self) -> &[u8] {
        match &self.data {
            Backing::Map(m) => m,
            Backing::Heap(v) => v,
        }
    }

    /// The items in file order.
    pub fn items(&self) -> &[MarianItem] {
        &self.items
    }

    pub fn get(&self, name: &str) -> Option<&MarianItem> {
        self.index.get(name).map(|&i| &self.items[i])
    }

    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    fn item(&self, name: &str) -> Result<&MarianItem> {
        self.get(name).ok_or_else(|| Error::invalid_model(format!("the model has no item {name}")))
    }

    /// The raw values of an item of this file (no quantMult, no padding).
    pub fn bytes(&self, item: &MarianItem) -> &[u8] {
        // An item of another file could lie outside this one: empty, not a panic.
        item.offset.checked_add(item.len).and_then(|end| self.data().get(item.offset..end)).unwrap_or(&[])
    }

    /// Whether the item `name` is a vector: `[n]` or Marian's `[1, n]` (read flattened, a
    /// `[2, 128]` for a `[1, 256]` loaded).
    pub fn check_vector(&self, name: &str) -> Result<()> {
        let shape = self.get(name).map(|it| it.shape.as_slice()).unwrap_or_default();
        match shape {
            [_] | [1, _] => Ok(()),
            _ => Err(Error::invalid_model(format!("Marian model: {name} has shape {shape:?}, expected a vector ([n] or [1, n])"))),
        }
    }

    /// The float32 that follows an intgemm item's values.
    fn quant_mult(&self, item: &MarianItem) -> Result<f32> {
        let at = item.offset + item.len; // checked when the item was made
        let value = self
            .data()
            .get(at..at + 4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or_else(|| Error::invalid_model(format!("{}: the quantMult lies past the end", item.name)))?;
        crate::format::check_scale(value, &item.name, "quantMult")
    }

    /// The YAML text of `special:model.yml` (up to its NUL, as Marian reads it).
    pub fn model_yaml(&self) -> Result<Option<String>> {
        let Some(item) = self.get(MODEL_YML) else { return Ok(None) };
        if item.item_type.element_size() != 1 || item.item_type.is_intgemm() {
            return Err(Error::invalid_model(format!(
                "{MODEL_YML} is stored as {}, not as bytes",
                item.item_type.name()
            )));
        }
        let bytes = self.bytes(item);
        let text = bytes.split(|&b| b == 0).next().unwrap_or_default();
        String::from_utf8(text.to_vec())
            .map(Some)
            .map_err(|_| Error::invalid_model(format!("{MODEL_YML} is not valid UTF-8")))
    }

    /// `special:model.yml` parsed.
    pub fn model_config(&self) -> Result<Option<Yaml>> {
        self.model_yaml()?.map(|t| yaml::parse(&t)).transpose()
    }

    /// A float32 item's values as stored (row-major by the Marian shape), float16 widened.
    pub fn float_values(&self, name: &str) -> Result<Vec<f32>> {
        let item = self.item(name)?;
        let b = self.bytes(item);
        match item.item_type {
            MarianType::Float32 => {
                Ok(b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
            }
            MarianType::Float16 => {
                Ok(b.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect())
            }
            t => Err(Error::invalid_model(format!("{name} is stored as {}, not as float32 or float16", t.name()))),
        }
    }

    /// An intgemm8 item's int8 values as stored and its quantMult.
    pub fn intgemm8(&self, name: &str) -> Result<(&[i8], f32)> {
        let item = self.item(name)?;
        if item.item_type != MarianType::Intgemm8 {
            return Err(Error::invalid_model(format!(
                "{name} is stored as {}, not as intgemm8",
                item.item_type.name()
            )));
        }
        let b = self.bytes(item);
        // SAFETY: i8 and u8 have the same size, alignment and every bit pattern valid.
        let values = unsafe { std::slice::from_raw_parts(b.as_ptr().cast::<i8>(), b.len()) };
        Ok((values, self.quant_mult(item)?))
    }

    /// An intgemm16 item's int16 values (little-endian, as stored) and its quantMult.
    pub fn intgemm16(&self, name: &str) -> Result<(&[i16], f32)> {
        let item = self.item(name)?;
        if item.item_type != MarianType::Intgemm16 {
            return Err(Error::invalid_model(format!(
                "{name} is stored as {}, not as intgemm16",
                item.item_type.name()
            )));
        }
        // SAFETY: every bit pattern is a valid i16; alignment is checked below.
        let (head, values, tail) = unsafe { self.bytes(item).align_to::<i16>() };
        if !head.is_empty() || !tail.is_empty() {
            return Err(Error::invalid_model(format!("{name}: intgemm16 values at an odd offset")));
        }
        Ok((values, self.quant_mult(item)?))
    }

    /// An intgemm item dequantized as Marian dequantizes `Wemb` at load:
    /// `value * (1 / quantMult)` in float32.
    pub fn intgemm_dequantized(&self, name: &str) -> Result<Vec<f32>> {
        let item = self.item(name)?;
        let inverse = match item.item_type {
            MarianType::Intgemm8 | MarianType::Intgemm16 => 1.0 / self.quant_mult(item)?,
            t => return Err(Error::invalid_model(format!("{name} is stored as {}, not as intgemm", t.name()))),
        };
        let b = self.bytes(item);
        Ok(match item.item_type {
            MarianType::Intgemm8 => b.iter().map(|&v| f32::from(v as i8) * inverse).collect(),
            _ => b.chunks_exact(2).map(|c| f32::from(i16::from_le_bytes([c[0], c[1]])) * inverse).collect(),
        })
    }

    /// The activation scale stored as item `name` (e.g. `encoder_l1_self_Wq_QuantMultA`,
    /// or `none_QuantMultA`, the name Marian's shortlisted output layer looks up), or
    /// `None` when the model has no such item. A float32 item holds it at offset 0; an
    /// intgemm8 one (`Wemb_QuantMultA` in Bergamot models) holds one int8 and a quantMult
    /// and is read as Marian reads it, dequantized like `Wemb` (`v * (1/quantMult)`; on
    /// en-pt 127 * (1/14.46729) = 8.778423, bit for bit `none_QuantMultA`).
    pub fn quant_mult_a(&self, name: &str) -> Result<Option<f32>> {
        let Some(item) = self.get(name) else { return Ok(None) };
        let values = match item.item_type {
            MarianType::Float32 if item.elements == 1 => self.float_values(name)?,
            MarianType::Intgemm8 if item.elements == 1 => self.intgemm_dequantized(name)?,
            t => {
                return Err(Error::invalid_model(format!(
                    "{name} ({} of shape {:?}) is not an activation scale",
                    t.name(),
                    item.shape
                )))
            }
        };
        values.first().map(|&v| crate::format::check_scale(v, name, "activation scale")).transpose()
    }

}
