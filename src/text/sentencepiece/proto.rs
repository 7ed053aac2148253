//! A small reader for the protobuf messages of a SentencePiece model file
//! (`sentencepiece_model.proto`, proto2). Only the fields that encoding and decoding use
//! are kept; every other field is skipped by its wire type. Malformed input (a truncated
//! varint or length, a length past the end, a wire type that does not exist, a piece that
//! is not UTF-8) is an [`Error`] of kind `InvalidModel`, never a panic.
use crate::error::{Error, Result};

fn err(what: impl std::fmt::Display) -> Error {
    Error::invalid_model(format!("invalid SentencePiece model: {what}"))
}

/// One field value as it is on the wire.
enum Value<'a> {
    Varint(u64),
    Fixed64,
    Bytes(&'a [u8]),
    Fixed32(u32),
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    fn varint(&mut self) -> Result<u64> {
        let mut value = 0u64;
        for i in 0..10 {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(err("truncated varint"));
            };
            self.pos += 1;
            value |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(err("varint longer than 10 bytes"))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| err("truncated field"))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    /// The next (field number, value), or `None` at the end of the message.
    fn next(&mut self) -> Result<Option<(u32, Value<'a>)>> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let field = key >> 3;
        if field == 0 || field > u64::from(u32::MAX >> 3) {
            return Err(err(format!("field number {field}")));
        }
        let value = match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Value::Fixed64
            }
            2 => {
                let n = self.varint()?;
                let n = usize::try_from(n).map_err(|_| err("length too large"))?;
                Value::Bytes(self.take(n)?)
            }
            5 => {
                let b = self.take(4)?;
                Value::Fixed32(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            }
            w => return Err(err(format!("unsupported wire type {w}"))),
        };
        Ok(Some((field as u32, value)))
    }
}

fn utf8(bytes: &[u8], what: &str) -> Result<String> {
    String::from_utf8(bytes.to_vec()).map_err(|_| err(format!("{what} is not valid UTF-8")))
}

/// `ModelProto.SentencePiece.Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceType {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl PieceType {
    fn from_wire(v: u64) -> Option<PieceType> {
        Some(match v {
            1 => PieceType::Normal,
            2 => PieceType::Unknown,
            3 => PieceType::Control,
            4 => PieceType::UserDefined,
            5 => PieceType::Unused,
            6 => PieceType::Byte,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone)]
pub struct PieceProto {
    pub piece: String,
    pub score: f32,
    pub kind: PieceType,
}

/// `TrainerSpec.ModelType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelType {
    Unigram,
    Bpe,
    Word,
    Char,
}

#[derive(Debug, Clone)]
pub struct TrainerSpec {
    pub model_type: ModelType,
    pub byte_fallback: bool,
    pub treat_whitespace_as_suffix: bool,
    pub unk_id: i32,
    pub bos_id: i32,
    pub eos_id: i32,
    pub pad_id: i32,
    pub unk_surface: Option<String>,
    pub unk_piece: String,
    pub bos_piece: String,
    pub eos_piece: String,
    pub pad_piece: String,
}

impl Default for TrainerSpec {
    fn default() -> Self {
        TrainerSpec {
            model_type: ModelType::Unigram,
            byte_fallback: false,
            treat_whitespace_as_suffix: false,
            unk_id: 0,
            bos_id: 1,
            eos_id: 2,
            pad_id: -1,
            unk_surface: None,
            unk_piece: "<unk>".into(),
            bos_piece: "<s>".into(),
            eos_piece: "</s>".into(),
            pad_piece: "<pad>".into(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct NormalizerSpec {
    pub name: String,
    pub precompiled_charsmap: Vec<u8>,
    pub add_dummy_prefix: bool,
    pub remove_extra_whitespaces: bool,
    pub escape_whitespaces: bool,
}

impl Default for NormalizerSpec {
    fn default() -> Self {
        NormalizerSpec {
            name: String::new(),
            precompiled_charsmap: Vec::new(),
            add_dummy_prefix: true,
            remove_extra_whitespaces: true,
            escape_whitespaces: true,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct ModelProto {
    pub pieces: Vec<PieceProto>,
    pub trainer_spec: TrainerSpec,
    pub normalizer_spec: NormalizerSpec,
    pub denormalizer_spec: Option<NormalizerSpec>,
}

fn parse_piece(buf: &[u8]) -> Result<PieceProto> {
    let mut r = Reader::new(buf);
    let mut p = PieceProto {
        piece: String::new(),
        score: 0.0,
        kind: PieceType::Normal,
    };
    while let Some((field, value)) = r.next()? {
        match (field, value) {
            (1, Value::Bytes(b)) => p.piece = utf8(b, "a piece")?,
            (2, Value::Fixed32(bits)) => p.score = f32::from_bits(bits),
            // proto2 keeps an unknown enum value out of the field (it stays NORMAL).
            (3, Value::Varint(v)) => {
                if let Some(kind) = PieceType::from_wire(v) {
                    p.kind = kind
                }
            }
            _ => {}
        }
    }
    Ok(p)
}

fn int32(v: u64) -> i32 {
    // int32 fields are sign-extended to 64 bits on the wire; truncation is proto's rule.
    v as i64 as i32
}

fn parse_trainer_spec(buf: &[u8], t: &mut TrainerSpec) -> Result<()> {
    let mut r = Reader::new(buf);
    while let Some((field, value)) = r.next()? {
        match (field, value) {
            (3, Value::Varint(v)) => {
                t.model_type = match v {
                    1 => ModelType::Unigram,
                    2 => ModelType::Bpe,
                    3 => ModelType::Word,
                    4 => ModelType::Char,
                    _ => return Err(err(format!("unknown model_type {v}"))),
                }
            }
            (24, Value::Varint(v)) => t.treat_whitespace_as_suffix = v != 0,
            (35, Value::Varint(v)) => t.byte_fallback = v != 0,
            (40, Value::Varint(v)) => t.unk_id = int32(v),
            (41, Value::Varint(v)) => t.bos_id = int32(v),
            (42, Value::Varint(v)) => t.eos_id = int32(v),
            (43, Value::Varint(v)) => t.pad_id = int32(v),
            (44, Value::Bytes(b)) => t.unk_surface = Some(utf8(b, "unk_surface")?),
            // An empty name means the default one (`ModelInterface::*_piece`).
            (45, Value::Bytes(b)) if !b.is_empty() => t.unk_piece = utf8(b, "unk_piece")?,
            (46, Value::Bytes(b)) if !b.is_empty() => t.bos_piece = utf8(b, "bos_piece")?,
            (47, Value::Bytes(b)) if !b.is_empty() => t.eos_piece = utf8(b, "eos_piece")?,
            (48, Value::Bytes(b)) if !b.is_empty() => t.pad_piece = utf8(b, "pad_piece")?,
            _ => {}
        }
    }
    Ok(())
}

fn parse_normalizer_spec(buf: &[u8], n: &mut NormalizerSpec) -> Result<()> {
    let mut r = Reader::new(buf);
    while let Some((field, value)) = r.next()? {
        match (field, value) {
            (1, Value::Bytes(b)) => n.name = utf8(b, "normalizer name")?,
            (2, Value::Bytes(b)) => n.precompiled_charsmap = b.to_vec(),
            (3, Value::Varint(v)) => n.add_dummy_prefix = v != 0,
            (4, Value::Varint(v)) => n.remove_extra_whitespaces = v != 0,
            (5, Value::Varint(v)) => n.escape_whitespaces = v != 0,
            _ => {}
        }
    }
    Ok(())
}

/// Parses a serialized `ModelProto`. Repeated occurrences of a sub-message merge, as in
/// protobuf.
pub fn parse_model(buf: &[u8]) -> Result<ModelProto> {
    let mut r = Reader::new(buf);
    let mut m = ModelProto::default();
    while let Some((field, value)) = r.next()? {
        match (field, value) {
            (1, Value::Bytes(b)) => m.pieces.push(parse_piece(b)?),
            (2, Value::Bytes(b)) => parse_trainer_spec(b, &mut m.trainer_spec)?,
            (3, Value::Bytes(b)) => parse_normalizer_spec(b, &mut m.normalizer_spec)?,
            (5, Value::Bytes(b)) => parse_normalizer_spec(
                b,
                m.denormalizer_spec
                    .get_or_insert_with(NormalizerSpec::default),
            )?,
            (_, Value::Varint(_) | Value::Fixed64 | Value::Fixed32(_) | Value::Bytes(_)) => {}
        }
    }
    Ok(m)
}
