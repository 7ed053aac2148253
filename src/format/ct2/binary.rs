//! Reader for CTranslate2's `model.bin` (binary versions 5 and 6).
//!
//! Layout (little-endian, no padding): `u32 version; str spec_name; u32 spec_revision;
//! u32 n; n x {str name; u8 rank; u32 dims[rank]; u8 dtype; u32 num_bytes; bytes};
//! u32 num_aliases; {str alias; str target}`, where `str` is a u16 length (including the
//! trailing NUL) followed by the bytes. The file is memory-mapped (or held in memory);
//! variables are recorded as byte ranges and converted on demand, so nothing is copied
//! that need not be.
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use half::{bf16, f16};

use crate::error::{Error, Result};
use crate::backend::SavedPrecision;
use crate::format::files::FileBytes;
use crate::format::Quantized;
use crate::tensor::Tensor;

/// The binary versions whose layout this reader implements.
pub const SUPPORTED_BINARY_VERSIONS: [u32; 2] = [5, 6];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    F32,
    I8,
    I16,
    I32,
    F16,
    BF16,
}

impl DType {
    fn from_id(id: u8) -> Option<DType> {
        Some(match id {
            0 => DType::F32,
            1 => DType::I8,
            2 => DType::I16,
            3 => DType::I32,
            4 => DType::F16,
            5 => DType::BF16,
            _ => return None,
        })
    }
    pub fn size(self) -> usize {
        match self {
            DType::I8 => 1,
            DType::I16 | DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
        }
    }
}

/// One stored variable: where its bytes are in the mapped file.
#[derive(Debug, Clone)]
pub struct RawVariable {
    pub name: String,
    pub shape: Vec<usize>,
    pub dtype: DType,
    offset: usize,
    num_bytes: usize,
}

impl RawVariable {
    pub fn num_elements(&self) -> usize {
        self.shape.iter().product()
    }
}

pub struct ModelBin {
    pub binary_version: u32,
    pub spec_name: String,
    pub spec_revision: u32,
    /// The file's bytes: float32 tensors borrow from them, so they live as long as the
    /// model's weights that do.
    data: FileBytes,
    variables: BTreeMap<String, RawVariable>,
    aliases: BTreeMap<String, String>,
}

struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len()).ok_or_else(|| {
            Error::invalid_model(format!(
                "model.bin is truncated: {what} needs {n} bytes at offset {} but the file has {} bytes",
                self.pos,
                self.data.len()
            ))
        })?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take(2, what)?.try_into().unwrap()))
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn string(&mut self, what: &str) -> Result<String> {
        let len = self.u16(what)? as usize;
        let bytes = self.take(len, what)?;
        // The stored length includes a trailing NUL.
        let bytes = bytes.strip_suffix(&[0]).unwrap_or(bytes);
        String::from_utf8(bytes.to_vec())
            .map_err(|_| Error::invalid_model(format!("model.bin: {what} is not valid UTF-8")))
    }
}

impl ModelBin {
    pub fn open(path: &Path) -> Result<ModelBin> {
        Self::parse(FileBytes::open(path)?)
    }

    /// Parses a `model.bin` held in memory (tests, fuzzing): the bytes are checked first,
    /// then copied, so the result is the same as for a mapped file.
    pub fn from_bytes(bytes: &[u8]) -> Result<ModelBin> {
        Self::parse_slice(bytes)?;
        Self::parse(FileBytes::copy_of(bytes)?)
    }

    /// Parses a mapped (or in-memory) `model.bin`.
    pub fn parse(data: FileBytes) -> Result<ModelBin> {
        let (binary_version, spec_name, spec_revision, variables, aliases) = Self::parse_slice(&data)?;
        Ok(ModelBin { binary_version, spec_name, spec_revision, data, variables, aliases })
    }

    /// Reads the layout: the header, where each variable's bytes are, the aliases.
    #[allow(clippy::type_complexity)]
    fn parse_slice(
        data: &[u8],
    ) -> Result<(u32, String, u32, BTreeMap<String, RawVariable>, BTreeMap<String, String>)> {
        let mut c = Cursor { data, pos: 0 };
        let binary_version = c.u32("the binary version")?;
        if !SUPPORTED_BINARY_VERSIONS.contains(&binary_version) {
            return Err(if binary_version < 5 {
                Error::unsupported(format!(
                    "model.bin has binary version {binary_version}, which is too old: Tolk reads \
                     versions 5 and 6; convert the model again with a recent ctranslate2"
                ))
            } else if binary_version < 100 {
                Error::unsupported(format!(
                    "model.bin has binary version {binary_version}, newer than the versions 5 and 6 Tolk reads"
                ))
            } else {
                Error::invalid_model(format!(
                    "model.bin does not look like a CTranslate2 model (binary version {binary_version})"
                ))
            });
        }
        let spec_name = c.string("the spec name")?;
        let spec_revision = c.u32("the spec revision")?;
        let num_variables = c.u32("the number of variables")? as usize;
        let mut variables = BTreeMap::new();
        for index in 0..num_variables {
            let name = c.string("a variable name")?;
            let rank = c.u8("a variable rank")? as usize;
            let mut shape = Vec::with_capacity(rank);
            for _ in 0..rank {
                shape.push(c.u32("a variable dimension")? as usize);
            }
            let dtype_id = c.u8("a variable dtype")?;
            let dtype = DType::from_id(dtype_id).ok_or_else(|| {
                Error::invalid_model(format!("model.bin: variable {name:?} has unknown dtype id {dtype_id}"))
            })?;
            let num_bytes = c.u32("a variable size")? as usize;
            let expected = shape
                .iter()
                .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| Error::invalid_model(format!("model.bin: variable {name:?} has absurd dimensions {shape:?}")))?;
            if expected != num_bytes {
                return Err(Error::invalid_model(format!(
                    "model.bin: variable {name:?} with shape {shape:?} and dtype {} should take {expected} bytes, \
                     but the file says {num_bytes}",
                    dtype.name()
                )));
            }
            let offset = c.pos;
            c.take(num_bytes, &format!("variable {name:?} (#{index})"))?;
            if variables.contains_key(&name) {
                return Err(Error::invalid_model(format!("model.bin: variable {name:?} is stored twice")));
            }
            variables.insert(name.clone(), RawVariable { name, shape, dtype, offset, num_bytes });
        }
        let num_aliases = c.u32("the number of aliases")? as usize;
        let mut aliases = BTreeMap::new();
        for _ in 0..num_aliases {
            let alias = c.string("an alias name")?;
            let target = c.string("an alias target")?;
            aliases.insert(alias, target);
        }
        if c.pos != c.data.len() {
            return Err(Error::invalid_model(format!(
                "model.bin has {} unexpected trailing bytes",
                c.data.len() - c.pos
            )));
        }
        for (alias, target) in &aliases {
            if resolve(&variables, &aliases, alias).is_none() {
                return Err(Error::invalid_model(format!(
                    "model.bin: alias {alias:?} points to missing variable {target:?}"
                )));
            }
        }
        Ok((binary_version, spec_name, spec_revision, variables, aliases))
    }

    /// Names of the stored variables (aliases excluded).
    pub fn variable_names(&self) -> impl Iterator<Item = &str> {
        self.variables.keys().map(String::as_str)
    }

    pub fn alias_names(&self) -> impl Iterator<Item = &str> {
        self.aliases.keys().map(String::as_str)
    }

    /// Looks a name up, following aliases (an alias `a` also maps `a_scale` to `target_scale`).
    pub fn resolve(&self, name: &str) -> Option<&RawVariable> {
        resolve(&self.variables, &self.aliases, name)
    }

    /// Whether some alias refers to the stored variable `name` (a shared weight).
    pub fn is_alias_target(&self, name: &str) -> bool {
        self.aliases.keys().any(|a| self.resolve(a).is_some_and(|v| v.name == name))
    }

    pub fn contains(&self, name: &str) -> bool {
        self.resolve(name).is_some()
    }

    fn bytes(&self, v: &RawVariable) -> &[u8] {
        &self.data[v.offset..v.offset + v.num_bytes]
    }

    /// Reads a scalar attribute as a float (any numeric dtype).
    pub fn scalar(&self, name: &str) -> Result<Option<f64>> {
        let Some(v) = self.resolve(name) else { return Ok(None) };
        if v.num_elements() != 1 {
            return Err(Error::invalid_model(format!("model.bin: attribute {name:?} should be a scalar, got shape {:?}", v.shape)));
        }
        let b = self.bytes(v);
        Ok(Some(match v.dtype {
            DType::I8 => b[0] as i8 as f64,
            DType::I16 => i16::from_le_bytes([b[0], b[1]]) as f64,
            DType::I32 => i32::from_le_bytes(b.try_into().unwrap()) as f64,
            DType::F32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
            DType::F16 => f16::from_le_bytes([b[0], b[1]]).to_f64(),
            DType::BF16 => bf16::from_le_bytes([b[0], b[1]]).to_f64(),
        }))
    }

    /// Reads a variable as float32. Quantized weights are dequantized with their
    /// `<name>_scale` (per row for int8, per tensor for int16), as CTranslate2 stores them.
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        let v = self
            .resolve(name)
            .ok_or_else(|| Error::invalid_model(format!("model.bin: missing variable {name:?}")))?;
        let n = v.num_elements();
        let b = self.bytes(v);
        let shape = v.shape.clone();
        let data: Vec<f32> = match v.dtype {
            DType::F32 => {
                if let Some(t) = Tensor::from_mapped(self.data.mapping(), v.offset, n, shape.clone()) {
                    return Ok(t);
                }
                b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
            }
            DType::F16 => b.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            DType::BF16 => b.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            DType::I8 | DType::I16 => {
                let scale = self.scales_of(name, v.dtype)?;
                let values: Vec<f32> = if v.dtype == DType::I8 {
                    b.iter().map(|&x| x as i8 as f32).collect()
                } else {
                    b.chunks_exact(2).map(|c| i16::from_le_bytes([c[0], c[1]]) as f32).collect()
                };
                dequantize(values, &shape, &scale, name)?
            }
            DType::I32 => {
                return Err(Error::invalid_model(format!("model.bin: variable {name:?} is int32, expected a float weight")))
            }
        };
        Ok(Tensor::from_vec(data, shape))
    }
}

fn resolve<'a>(
    variables: &'a BTreeMap<String, RawVariable>,
    aliases: &BTreeMap<String, String>,
    name: &str,
) -> Option<&'a RawVariable> {
    let mut name = name.to_string();
    for _ in 0..8 {
        if let Some(v) = variables.get(&name) {
            return Some(v);
        }
        if let Some(target) = aliases.get(&name) {
            name = target.clone();
            continue;
        }
        let base = name.strip_suffix("_scale")?;
        name = format!("{}_scale", aliases.get(base)?);
    }
    None
}

impl ModelBin {
    /// The stored dtype of a variable (after aliases).
    pub fn dtype(&self, name: &str) -> Option<DType> {
        self.resolve(name).map(|v| v.dtype)
    }

    /// The type quantizable weights are saved in (the dtype of the first `*weight`
    /// variable): what CTranslate2's compute type "default" keeps.
    pub fn saved_weight_type(&self) -> DType {
        self.variables.values().find(|v| v.name.ends_with("weight")).map(|v| v.dtype).unwrap_or(DType::F32)
    }

    /// The scales `{name}_scale` of the quantized weight `name`, each a positive finite
    /// number (a corrupt one dequantized to garbage).
    fn scales_of(&self, name: &str, dtype: DType) -> Result<Tensor> {
        let scale_name = format!("{name}_scale");
        let scale = self.tensor(&scale_name).map_err(|_| {
            Error::invalid_model(format!("model.bin: quantized {} variable {name:?} has no {scale_name:?}", dtype.name()))
        })?;
        scale.iter().try_for_each(|&s| crate::format::check_scale(s, &scale_name, "scale").map(drop))?;
        Ok(scale)
    }

    /// The raw values and scales of an int8/int16 weight; `None` for other dtypes.
    pub fn quantized(&self, name: &str) -> Result<Option<Quantized<'_>>> {
        let Some(v) = self.resolve(name) else {
            return Err(Error::invalid_model(format!("model.bin: missing variable {name:?}")));
        };
        if !matches!(v.dtype, DType::I8 | DType::I16) {
            return Ok(None);
        }
        let scale = self.scales_of(name, v.dtype)?;
        let rows = v.shape.first().copied().unwrap_or(1);
        let b = self.bytes(v);
        if v.dtype == DType::I8 {
            if scale.len() != rows {
                return Err(Error::invalid_model(format!(
                    "model.bin: {name:?} has {rows} rows but its scale has {} values",
                    scale.len()
                )));
            }
            return Ok(Some(Quantized::Int8 {
                values: Cow::Borrowed(bytemuck::cast_slice(b)),
                scales: scale.to_vec(),
                activation_scale: None,
                intgemm: false,
            }));
        }
        if scale.len() != 1 {
            return Err(Error::invalid_model(format!("model.bin: int16 {name:?} needs one scale, got {}", scale.len())));
        }
        let values = b.chunks_exact(2).map(|c| i16::from_le_bytes([c[0], c[1]])).collect();
        Ok(Some(Quantized::Int16 { values, scale: scale[0] }))
    }
}

/// `W = Wq * (1 / scale)`, with one scale per row (int8) or one for the whole tensor
/// (int16); multiplying by the reciprocal rounds exactly as CTranslate2's dequantize does.
fn dequantize(mut values: Vec<f32>, shape: &[usize], scale: &Tensor, name: &str) -> Result<Vec<f32>> {
    let rows = shape.first().copied().unwrap_or(1).max(1);
    let cols = values.len() / rows;
    if scale.len() == 1 {
        let r = 1.0 / scale[0];
        values.iter_mut().for_each(|x| *x *= r);
    } else if scale.len() == rows {
        for (row, &s) in values.chunks_mut(cols.max(1)).zip(scale.iter()) {
            let r = 1.0 / s;
            row.iter_mut().for_each(|x| *x *= r);
        }
    } else {
        return Err(Error::invalid_model(format!(
            "model.bin: {name:?} has {rows} rows but its scale has {} values",
            scale.len()
        )));
    }
    Ok(values)
}

impl ModelBin {
    /// Drops the resident pages lying wholly inside one variable's data, once it has been
    /// converted: the loading peak then holds the built model plus one raw weight, not the
    /// whole file besides.
    pub fn release_variable(&self, name: &str) {
        if let Some(v) = self.resolve(name) {
            self.data.release(v.offset..v.offset + v.num_bytes);
        }
    }
}

impl crate::format::WeightSource for ModelBin {
    fn file_name(&self) -> &str {
        "model.bin"
    }
    fn variable_names(&self) -> Vec<String> {
        ModelBin::variable_names(self).map(str::to_string).collect()
    }
    fn stored_name(&self, name: &str) -> Option<String> {
        self.resolve(name).map(|v| v.name.clone())
    }
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.resolve(name).map(|v| v.shape.clone())
    }
    fn is_shared(&self, stored: &str) -> bool {
        self.is_alias_target(stored)
    }
    fn tensor(&self, name: &str) -> Result<Tensor> {
        ModelBin::tensor(self, name)
    }
    fn quantized(&self, name: &str) -> Result<Option<Quantized<'_>>> {
        ModelBin::quantized(self, name)
    }
    fn scalar(&self, name: &str) -> Result<Option<f64>> {
        ModelBin::scalar(self, name)
    }
    fn is_flag(&self, name: &str) -> bool {
        self.dtype(name) == Some(DType::I8)
    }
    fn saved_precision(&self) -> SavedPrecision {
        match self.saved_weight_type() {
            DType::I8 => SavedPrecision::Int8,
            DType::I16 => SavedPrecision::Int16,
            _ => SavedPrecision::Float,
        }
    }
    fn release(&self, stored: &str) {
        self.release_variable(stored)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn str_bytes(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&((s.len() + 1) as u16).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
        out.push(0);
    }

    fn var(out: &mut Vec<u8>, name: &str, shape: &[u32], dtype: u8, data: &[u8]) {
        str_bytes(out, name);
        out.push(shape.len() as u8);
        shape.iter().for_each(|d| out.extend_from_slice(&d.to_le_bytes()));
        out.push(dtype);
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(data);
    }

    fn parse_bytes(bytes: &[u8]) -> Result<ModelBin> {
        ModelBin::from_bytes(bytes)
    }

    /// A model.bin with an int8 weight (2 x 2, per-row scales), an int16 scalar-scaled
    /// weight, a float16 vector and an alias to the int8 weight.
    fn sample() -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&6u32.to_le_bytes());
        str_bytes(&mut b, "TransformerSpec");
        b.extend_from_slice(&7u32.to_le_bytes());
        b.extend_from_slice(&5u32.to_le_bytes());
        var(&mut b, "a/weight", &[2, 2], 1, &[10u8, 246, 127, 0]); // [[10, -10], [127, 0]]
        let scales: Vec<u8> = [10f32, 127f32].iter().flat_map(|v| v.to_le_bytes()).collect();
        var(&mut b, "a/weight_scale", &[2], 0, &scales);
        var(&mut b, "h", &[2], 4, &[f16::from_f32(0.5).to_le_bytes(), f16::from_f32(-2.0).to_le_bytes()].concat());
        var(&mut b, "q/weight", &[2], 2, &[100i16.to_le_bytes(), (-50i16).to_le_bytes()].concat());
        var(&mut b, "q/weight_scale", &[], 0, &100f32.to_le_bytes());
        b.extend_from_slice(&1u32.to_le_bytes());
        str_bytes(&mut b, "tied/weight");
        str_bytes(&mut b, "a/weight");
        b
    }

    #[test]
    fn dequantizes_and_follows_aliases_with_their_scales() {
        let bin = parse_bytes(&sample()).unwrap();
        assert_eq!(bin.binary_version, 6);
        assert_eq!(&bin.tensor("a/weight").unwrap()[..], &[1.0, -1.0, 1.0, 0.0]);
        assert_eq!(&bin.tensor("tied/weight").unwrap()[..], &[1.0, -1.0, 1.0, 0.0]);
        assert!(bin.resolve("tied/weight_scale").is_some(), "an alias also maps <alias>_scale");
        assert_eq!(&bin.tensor("h").unwrap()[..], &[0.5, -2.0]);
        assert_eq!(&bin.tensor("q/weight").unwrap()[..], &[1.0, -0.5]);
        assert!(bin.is_alias_target("a/weight") && !bin.is_alias_target("h"));
        assert_eq!(bin.scalar("q/weight_scale").unwrap(), Some(100.0));
    }

    #[test]
    fn inconsistent_sizes_unknown_dtypes_and_dangling_aliases_are_errors() {
        let good = sample();
        // The first variable's dtype byte sits after: version, spec string, revision,
        // count, name, rank, dims.
        let dtype_at = 4 + 2 + 16 + 4 + 4 + 2 + 9 + 1 + 8;
        assert_eq!(good[dtype_at], 1);
        let mut bad = good.clone();
        bad[dtype_at] = 9;
        assert!(parse_bytes(&bad).err().unwrap().message.contains("dtype"));
        let mut bad = good.clone();
        bad[dtype_at + 1] = 5; // num_bytes no longer matches the shape
        assert!(parse_bytes(&bad).is_err());
        let mut bad = good.clone();
        let n = bad.len();
        bad[n - 9..n - 1].copy_from_slice(b"missing!");
        assert!(parse_bytes(&bad).err().unwrap().message.contains("alias"));
        let mut bad = good;
        bad.push(0);
        assert!(parse_bytes(&bad).err().unwrap().message.contains("trailing"));
    }
}
