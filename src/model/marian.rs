//! Marian models (Bergamot "tiny"/"base" students and Marian transformers): a transformer
//! encoder and a decoder whose layers attend to their past with self-attention or an SSRU.
//!
//! The model file is presented to the Transformer builder under Tolk's spec names
//! ([`MarianWeights`], the way CTranslate2's converter maps Marian names, done at load):
//! matrices as `[out, in]`, Q/K/V fused, attributes from `special:model.yml`. The built
//! model is a [`TransformerModel`] plus what Marian packages add: a lexical shortlist
//! and decoding settings.
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use crate::backend::{Backend, ComputeType, Ctx, FloatOrder, KvCacheType, SavedPrecision};
use crate::error::{Error, Result};
use crate::format::ct2::Vocabulary;
use crate::format::marian::{MarianFile, MarianType, Yaml};
use crate::format::package::MarianPackage;
use crate::format::shortlist::Shortlist;
use crate::format::{Quantized, WeightSource};
use crate::model::{DecoderSession, PackageDecoding, Sources, SpecialTokens, TransformerModel, TranslationModel};
use crate::tensor::Tensor;

/// The layer normalization epsilon of Marian's transformer (`Transformer::layerNorm` passes
/// 1e-6 to `marian::layerNorm`, whose own default is 1e-9).
const LAYER_NORM_EPSILON: f32 = 1e-6;

/// A Marian model with its package: vocabularies, shortlist, decoding settings.
pub struct MarianModel<B: Backend> {
    transformer: TransformerModel<B>,
    shortlist: Option<Shortlist>,
    shared_vocabulary: bool,
    decoding: PackageDecoding,
    description: String,
}

/// How the weights' products run, from `gemm-precision` and the compute type asked for.
fn use_alphas(package: &MarianPackage) -> bool {
    package.gemm_precision.as_deref().is_none_or(|p| p.contains("Alpha"))
}

impl<B: Backend> MarianModel<B> {
    /// Builds the model from its package; `source`/`target` are the vocabularies (read by
    /// the caller from the package's `.spm` or `.yml` files).
    pub fn load(package: &MarianPackage, backend: &B, compute_type: ComputeType, source: Vocabulary, target: Vocabulary) -> Result<Self> {
        let file = MarianFile::open_in(&package.files, &package.model)?;
        let config = match file.model_config()? {
            Some(c) => c,
            None => {
                return Err(Error::invalid_model(format!(
                    "{} has no special:model.yml: Tolk needs the model's configuration",
                    package.model.display()
                )))
            }
        };
        let compute_type = match (compute_type, package.gemm_precision.as_deref()) {
            (ComputeType::Default, Some("float32")) => ComputeType::Float32,
            (ComputeType::Default, Some(p)) if p.starts_with("int16") => ComputeType::Int16,
            (ComputeType::Default, Some(p)) if p.starts_with("int8") => ComputeType::Int8,
            (ComputeType::Default, Some(p)) => {
                return Err(Error::unsupported(format!(
                    "gemm-precision {p:?} is not supported (float32, int8, int8shift, int8shiftAlpha, int8shiftAlphaAll, int16 are)"
                )))
            }
            (other, _) => other,
        };
        let weights = MarianWeights::new(&file, &config, use_alphas(package))?;
        let shared_vocabulary = package.vocabulary_files().0 == package.vocabulary_files().1;
        let special_tokens = SpecialTokens {
            bos: "<s>".into(),
            eos: "</s>".into(),
            unk: "<unk>".into(),
            // Marian feeds a zero vector at the first step; the start id is never embedded.
            decoder_start: Some("</s>".into()),
            add_source_bos: false,
            add_source_eos: true,
        };
        let transformer =
            TransformerModel::build(&weights, backend, compute_type, Some(LAYER_NORM_EPSILON), special_tokens, source, target)?;
        // What the products use: the scales only where int8 runs and the file has them.
        let precision = match transformer.compute_type {
            ComputeType::Int8 if weights.alphas && file.items().iter().any(|i| i.name.ends_with("_QuantMultA")) => {
                "int8 with precomputed activation scales".to_string()
            }
            other => other.name().to_string(),
        };
        let decoder_kind = weights.decoder_kind;
        // The model holds copies of everything it uses: unmapped now, the file's pages are
        // gone before the shortlist is read.
        drop(weights);
        drop(file);
        let shortlist = match &package.shortlist {
            Some(s) => {
                let (sv, tv) = (&transformer.source_vocabulary, &transformer.target_vocabulary);
                let (source_id, target_id) = (|t: &str| Some(sv.id_or_unk(t)), |t: &str| Some(tv.id_or_unk(t)));
                let shortlist = Shortlist::open_in(&package.files, &s.path, s.first, s.best, &source_id, &target_id)?;
                shortlist
                    .check_target_vocabulary(tv.len())
                    .map_err(|e| Error::invalid_model(format!("{}: {}", s.path.display(), e.message)))?;
                Some(shortlist)
            }
            None => None,
        };
        // Marian's own defaults where the package's YAML does not say (marian-decoder:
        // beam-size 12, normalize 0, max-length-factor 3).
        let decoding = PackageDecoding {
            beam_size: package.beam_size.or(Some(12)),
            length_penalty: package.normalize.or(Some(0.0)),
            max_length_factor: package.max_length_factor.or(Some(3.0)),
            max_batch_size: package.mini_batch,
            min_length: Some(0),
            allow_unk: package.allow_unk,
        };
        let description = format!(
            "Marian transformer ({decoder_kind} decoder, {precision}{})",
            if shortlist.is_some() { ", lexical shortlist" } else { "" }
        );
        Ok(MarianModel { transformer, shortlist, shared_vocabulary, decoding, description })
    }
}

impl<B: Backend> TranslationModel for MarianModel<B> {
    fn description(&self) -> String {
        self.description.clone()
    }
    fn source_vocabulary(&self) -> &Vocabulary {
        &self.transformer.source_vocabulary
    }
    fn target_vocabulary(&self) -> &Vocabulary {
        &self.transformer.target_vocabulary
    }
    fn special_tokens(&self) -> &SpecialTokens {
        &self.transformer.special_tokens
    }
    fn max_source_positions(&self) -> Option<usize> {
        self.transformer.max_source_positions()
    }
    fn max_target_positions(&self) -> Option<usize> {
        self.transformer.max_target_positions()
    }
    fn compute_type(&self) -> ComputeType {
        self.transformer.compute_type
    }
    fn saved_precision(&self) -> SavedPrecision {
        self.transformer.saved_precision
    }
    fn package_decoding(&self) -> PackageDecoding {
        self.decoding.clone()
    }
    fn output_candidates(&self, sources: &[Vec<u32>]) -> Option<Vec<u32>> {
        let shortlist = self.shortlist.as_ref()?;
        let words: Vec<u32> = sources.iter().flatten().copied().collect();
        Some(shortlist.generate(&words, self.transformer.target_vocabulary.len(), self.shared_vocabulary))
    }
    fn takes_rows_in(&self) -> bool {
        self.transformer.takes_rows_in()
    }
    fn position_bytes(&self, kv: KvCacheType) -> usize {
        self.transformer.position_bytes(kv)
    }
    fn weight_bytes(&self) -> usize {
        self.transformer.weight_bytes()
    }
    fn start<'a>(&'a self, ctx: &Ctx, sources: Sources<'_>, output_ids: Option<Vec<u32>>, kv: KvCacheType) -> Result<Box<dyn DecoderSession + 'a>> {
        self.transformer.start(ctx, sources, output_ids, kv)
    }
}

/// Where a spec variable's data comes from in the Marian file.
enum Source {
    /// One matrix, or several stacked along the output dimension (fused Q/K/V, K/V).
    Matrix(Vec<String>),
    /// One vector, or several concatenated; `None` parts are zeros of the given length.
    Vector(Vec<(Option<String>, usize)>),
    /// A scalar attribute derived from the configuration.
    Scalar(f64),
}

/// A Marian model file under Tolk's spec names.
pub struct MarianWeights<'a> {
    file: &'a MarianFile,
    variables: BTreeMap<String, Source>,
    aliases: BTreeMap<String, String>,
    /// Use the precomputed activation scales (`*_QuantMultA`) of int8 weights.
    alphas: bool,
    decoder_kind: &'static str,
    /// Pre-norm layers name their norms `*_ln_scale_pre` (Marian's `preProcess`).
    pre_norm: bool,
    /// The config's `enc-depth` and `dec-depth`.
    depths: (usize, usize),
}

/// The model config's settings: absent ones take Marian's defaults, and a value of the
/// wrong kind is an error (defaulted, `transformer-heads: abc` ran with 8 heads and
/// `transformer-ffn-activation: [relu]` with swish, both translating garbage).
fn get_str<'y>(config: &'y Yaml, key: &str, default: &'y str) -> Result<&'y str> {
    Ok(config.string_at(key).map_err(in_model)?.unwrap_or(default))
}

fn get_count(config: &Yaml, key: &str, default: usize) -> Result<usize> {
    Ok(config.count_at(key).map_err(in_model)?.unwrap_or(default))
}

fn get_bool(config: &Yaml, key: &str) -> Result<bool> {
    Ok(config.bool_at(key).map_err(in_model)?.unwrap_or(false))
}

fn in_model(e: Error) -> Error {
    Error::new(e.kind, format!("Marian model: {}", e.message))
}

impl<'a> MarianWeights<'a> {
    pub fn new(file: &'a MarianFile, config: &Yaml, alphas: bool) -> Result<MarianWeights<'a>> {
        let refuse = |what: String| Err(Error::unsupported(format!("Marian model: {what}")));
        let model_type = get_str(config, "type", "transformer")?;
        if model_type != "transformer" {
            return refuse(format!("type {model_type:?} is not supported (transformer is)"));
        }
        // Pre/post-processing orders: post-norm ("" / "dan") or pre-norm ("n" / "da" with a final "n").
        let pre = get_str(config, "transformer-preprocess", "")?;
        let post = get_str(config, "transformer-postprocess", "dan")?;
        let top = get_str(config, "transformer-postprocess-top", "")?;
        let emb = get_str(config, "transformer-postprocess-emb", "d")?;
        let pre_norm = match (pre, post) {
            ("" | "d", "dan") => false,
            ("n" | "dn" | "nd", "da" | "ad") => true,
            _ => return refuse(format!("transformer-preprocess {pre:?} with transformer-postprocess {post:?} is not supported (\"\"/dan or n/da are)")),
        };
        if pre_norm != top.contains('n') {
            return refuse(format!("transformer-postprocess-top {top:?} does not match the {} layers", if pre_norm { "pre-norm" } else { "post-norm" }));
        }
        if emb.contains('n') || emb.contains('a') {
            return refuse(format!("transformer-postprocess-emb {emb:?} is not supported (d is)"));
        }
        // Marian's gelu is `x * sigmoid(1.702 x)` (Tolk's gelu-sigmoid).
        let activation_id = |key: &str| match get_str(config, key, "swish")? {
            "relu" => Ok(0.0),
            "swish" => Ok(2.0),
            "gelu" => Ok(4.0),
            other => Err(Error::unsupported(format!("Marian model: {key} {other:?} is not supported (relu, swish, gelu are)"))),
        };
        let activation = activation_id("transformer-ffn-activation")?;
        let ffn_depth = get_count(config, "transformer-ffn-depth", 2)?;
        if ffn_depth != 2 {
            return refuse(format!("transformer-ffn-depth {ffn_depth} is not supported (2 is)"));
        }
        if !matches!(get_count(config, "transformer-decoder-ffn-depth", 0)?, 0 | 2) {
            return refuse("transformer-decoder-ffn-depth other than 2 is not supported".into());
        }
        let tied = config.get("transformer-tied-layers").and_then(Yaml::as_list).is_some_and(|l| !l.is_empty());
        if tied {
            return refuse("transformer-tied-layers is not supported".into());
        }
        if get_bool(config, "transformer-train-position-embeddings")? {
            return refuse("learned position embeddings are not supported".into());
        }
        let autoreg = get_str(config, "transformer-decoder-autoreg", "self-attention")?;
        let dec_cell = get_str(config, "dec-cell", "gru")?;
        let decoder_kind = match (autoreg, dec_cell) {
            ("self-attention", _) => "self-attention",
            ("rnn", "ssru") => "SSRU",
            ("rnn", cell) => return refuse(format!("decoder cell {cell:?} is not supported (ssru is)")),
            ("average-attention", _) => "average-attention",
            (other, _) => return refuse(format!("transformer-decoder-autoreg {other:?} is not supported")),
        };
        let heads = get_count(config, "transformer-heads", 8)? as f64;
        let enc_depth = get_count(config, "enc-depth", 6)?;
        let dec_depth = get_count(config, "dec-depth", 6)?;

        let mut w = MarianWeights {
            file,
            variables: BTreeMap::new(),
            aliases: BTreeMap::new(),
            alphas,
            decoder_kind,
            pre_norm,
            depths: (enc_depth, dec_depth),
        };
        // Embeddings: one table for everything (tied-embeddings-all), or per side.
        let (source_emb, target_emb) = if file.contains("Wemb") {
            ("Wemb", if file.contains("decoder_Wemb") { "decoder_Wemb" } else { "Wemb" })
        } else {
            ("encoder_Wemb", "decoder_Wemb")
        };
        w.matrix("encoder/embeddings/weight", &[source_emb])?;
        if target_emb == source_emb {
            w.aliases.insert("decoder/embeddings/weight".into(), "encoder/embeddings/weight".into());
        } else {
            w.matrix("decoder/embeddings/weight", &[target_emb])?;
        }
        // The output layer: tied to the target embeddings unless the file has its own.
        if let Some(own) = ["decoder_ff_logit_out_Wt", "decoder_ff_logit_out_W"].into_iter().find(|n| file.contains(n)) {
            w.matrix("decoder/projection/weight", &[own])?;
        } else {
            let target = if target_emb == source_emb { "encoder/embeddings/weight" } else { "decoder/embeddings/weight" };
            w.aliases.insert("decoder/projection/weight".into(), target.into());
        }
        if file.contains("decoder_ff_logit_out_b") {
            w.vector("decoder/projection/bias", &["decoder_ff_logit_out_b"])?;
        }
        for scope in ["encoder", "decoder"] {
            w.variables.insert(format!("{scope}/num_heads"), Source::Scalar(heads));
            w.variables.insert(format!("{scope}/pre_norm"), Source::Scalar(pre_norm as u8 as f64));
            w.variables.insert(format!("{scope}/activation"), Source::Scalar(activation));
            w.variables.insert(format!("{scope}/position_start"), Source::Scalar(0.0));
        }
        w.variables.insert("decoder/start_from_zero_embedding".into(), Source::Scalar(1.0));
        if pre_norm {
            w.norm("encoder/layer_norm", "encoder_top_ln")?;
            w.norm("decoder/layer_norm", "decoder_top_ln")?;
        }
        for i in 0..enc_depth {
            let (s, m) = (format!("encoder/layer_{i}"), format!("encoder_l{}", i + 1));
            w.linear(&format!("{s}/self_attention/linear_0"), &[&format!("{m}_self_Wq"), &format!("{m}_self_Wk"), &format!("{m}_self_Wv")])?;
            w.linear(&format!("{s}/self_attention/linear_1"), &[&format!("{m}_self_Wo")])?;
            w.norm(&format!("{s}/self_attention/layer_norm"), &format!("{m}_self_Wo_ln"))?;
            w.ffn(&format!("{s}/ffn"), &format!("{m}_ffn"))?;
        }
        for i in 0..dec_depth {
            let (s, m) = (format!("decoder/layer_{i}"), format!("decoder_l{}", i + 1));
            if decoder_kind == "average-attention" {
                let a = format!("{s}/average_attention");
                let depth = get_count(config, "transformer-aan-depth", 2)?.max(1);
                for j in 1..depth {
                    w.linear(&format!("{a}/linear_{}", j - 1), &[&format!("{m}_aan_W{j}")])?;
                }
                if file.contains(&format!("{m}_aan_W{depth}")) {
                    w.linear(&format!("{a}/projection"), &[&format!("{m}_aan_W{depth}")])?;
                }
                if !get_bool(config, "transformer-aan-nogate")? {
                    w.linear(&format!("{a}/gate_input"), &[&format!("{m}_aan_Wi")])?;
                    w.linear(&format!("{a}/gate_forget"), &[&format!("{m}_aan_Wf")])?;
                }
                w.norm(&format!("{a}/layer_norm"), &format!("{m}_aan_ffn_ln"))?;
                w.variables.insert(format!("{a}/activation"), Source::Scalar(activation_id("transformer-aan-activation")?));
            } else if decoder_kind == "SSRU" {
                w.matrix(&format!("{s}/ssru/linear_0/weight"), &[&format!("{m}_rnn_W")])?;
                w.linear(&format!("{s}/ssru/linear_1"), &[&format!("{m}_rnn_Wf")])?;
                // Marian's DecoderLayerRNN pre-processes under `_rnn` and post-processes
                // under `_rnn_ffn`.
                let norm = if pre_norm { format!("{m}_rnn_ln") } else { format!("{m}_rnn_ffn_ln") };
                w.norm(&format!("{s}/ssru/layer_norm"), &norm)?;
            } else {
                w.linear(&format!("{s}/self_attention/linear_0"), &[&format!("{m}_self_Wq"), &format!("{m}_self_Wk"), &format!("{m}_self_Wv")])?;
                w.linear(&format!("{s}/self_attention/linear_1"), &[&format!("{m}_self_Wo")])?;
                w.norm(&format!("{s}/self_attention/layer_norm"), &format!("{m}_self_Wo_ln"))?;
            }
            w.linear(&format!("{s}/attention/linear_0"), &[&format!("{m}_context_Wq")])?;
            w.linear(&format!("{s}/attention/linear_1"), &[&format!("{m}_context_Wk"), &format!("{m}_context_Wv")])?;
            w.linear(&format!("{s}/attention/linear_2"), &[&format!("{m}_context_Wo")])?;
            w.norm(&format!("{s}/attention/layer_norm"), &format!("{m}_context_Wo_ln"))?;
            w.ffn(&format!("{s}/ffn"), &format!("{m}_ffn"))?;
        }
        w.check_all_items_mapped()?;
        Ok(w)
    }

    fn require(&self, item: &str) -> Result<()> {
        if self.file.contains(item) {
            Ok(())
        } else {
            Err(Error::invalid_model(format!("Marian model: missing item {item:?}")))
        }
    }

    fn matrix(&mut self, name: &str, items: &[&str]) -> Result<()> {
        for item in items {
            self.require(item)?;
        }
        // Stacked matrices (fused Q/K/V) must all take the same inputs.
        let inputs = self.in_dim(items[0])?;
        for item in &items[1..] {
            if self.in_dim(item)? != inputs {
                return Err(Error::invalid_model(format!("Marian model: {item} does not take the {inputs} inputs of {}", items[0])));
            }
        }
        self.variables.insert(name.into(), Source::Matrix(items.iter().map(|s| s.to_string()).collect()));
        Ok(())
    }

    fn require_vector(&self, item: &str) -> Result<()> {
        self.require(item)?;
        self.file.check_vector(item)
    }

    fn vector(&mut self, name: &str, items: &[&str]) -> Result<()> {
        let mut parts = Vec::new();
        for item in items {
            self.require_vector(item)?;
            parts.push((Some(item.to_string()), 0));
        }
        self.variables.insert(name.into(), Source::Vector(parts));
        Ok(())
    }

    /// A linear layer from Marian's `W*` matrices and their `b*` biases (stacked).
    fn linear(&mut self, scope: &str, weights: &[&str]) -> Result<()> {
        self.matrix(&format!("{scope}/weight"), weights)?;
        let mut parts = Vec::new();
        for w in weights {
            let bias = bias_name(w);
            let out = self.out_dim(w)?;
            let stored = self.file.contains(&bias);
            if stored {
                self.require_vector(&bias)?;
            }
            parts.push((stored.then_some(bias), out));
        }
        if parts.iter().any(|p| p.0.is_some()) {
            self.variables.insert(format!("{scope}/bias"), Source::Vector(parts));
        }
        Ok(())
    }

    /// A block's norm: `{prefix}_scale`/`_bias` after it (post-norm) or, before it
    /// (pre-norm), `{prefix}_scale_pre`/`_bias_pre`.
    fn norm(&mut self, scope: &str, prefix: &str) -> Result<()> {
        let pre = if self.pre_norm && !prefix.ends_with("top_ln") { "_pre" } else { "" };
        self.vector(&format!("{scope}/gamma"), &[&format!("{prefix}_scale{pre}")])?;
        self.vector(&format!("{scope}/beta"), &[&format!("{prefix}_bias{pre}")])
    }

    fn ffn(&mut self, scope: &str, prefix: &str) -> Result<()> {
        self.linear(&format!("{scope}/linear_0"), &[&format!("{prefix}_W1")])?;
        self.linear(&format!("{scope}/linear_1"), &[&format!("{prefix}_W2")])?;
        self.norm(&format!("{scope}/layer_norm"), &format!("{prefix}_ffn_ln"))
    }

    /// Output features of a Marian matrix: its second dimension (`x · W` with `W` [in, out]),
    /// except for embeddings, stored [vocabulary, d].
    fn out_dim(&self, item: &str) -> Result<usize> {
        self.dims(item).map(|(out, _)| out)
    }

    fn in_dim(&self, item: &str) -> Result<usize> {
        self.dims(item).map(|(_, inputs)| inputs)
    }

    /// `(outputs, inputs)` of a Marian matrix (see [`is_embedding`] for which is which).
    fn dims(&self, item: &str) -> Result<(usize, usize)> {
        let shape = &self.file.get(item).ok_or_else(|| Error::invalid_model(format!("Marian model: missing item {item:?}")))?.shape;
        match shape.as_slice() {
            [rows, cols] if is_embedding(item) => Ok((*rows, *cols)),
            [rows, cols] => Ok((*cols, *rows)),
            other => Err(Error::invalid_model(format!("Marian model: {item} has shape {other:?}, expected a matrix"))),
        }
    }

    /// Every item must be used (or be an activation scale or the configuration): an
    /// unknown item belongs to a feature Tolk would silently ignore.
    fn check_all_items_mapped(&self) -> Result<()> {
        let mut used = BTreeSet::new();
        for source in self.variables.values() {
            match source {
                Source::Matrix(items) => used.extend(items.iter().cloned()),
                Source::Vector(parts) => used.extend(parts.iter().filter_map(|p| p.0.clone())),
                Source::Scalar(_) => {}
            }
        }
        let unknown: Vec<&str> = self
            .file
            .items()
            .iter()
            .map(|i| i.name.as_str())
            .filter(|n| !used.contains(*n) && !n.ends_with("_QuantMultA") && !n.starts_with("special:"))
            .collect();
        if unknown.is_empty() {
            return Ok(());
        }
        // Layers past the configured depth: the config and the file disagree.
        let beyond = |stack: &str, depth: usize| {
            unknown.iter().find_map(|n| {
                let layer: usize = n.strip_prefix(stack)?.split('_').next()?.parse().ok()?;
                (layer > depth).then_some(layer)
            })
        };
        for (stack, key, depth) in [("encoder_l", "enc-depth", self.depths.0), ("decoder_l", "dec-depth", self.depths.1)] {
            if let Some(layer) = beyond(stack, depth) {
                return Err(Error::invalid_model(format!(
                    "Marian model: the file has items of {stack}{layer} but {key} in its config is {depth}"
                )));
            }
        }
        Err(Error::unsupported(format!(
            "Marian model: items of features Tolk does not support: {}{}",
            unknown.iter().take(6).copied().collect::<Vec<_>>().join(", "),
            if unknown.len() > 6 { format!(" and {} more", unknown.len() - 6) } else { String::new() }
        )))
    }

    fn resolve(&self, name: &str) -> Option<(&str, &Source)> {
        let name = self.aliases.get(name).map(String::as_str).unwrap_or(name);
        self.variables.get_key_value(name).map(|(k, v)| (k.as_str(), v))
    }

    /// A Marian matrix as float32 `[out, in]`.
    fn matrix_values(&self, item: &str) -> Result<(Vec<f32>, usize, usize)> {
        let (out, inputs) = self.dims(item)?;
        let intgemm = self.file.get(item).is_some_and(|it| matches!(it.item_type, MarianType::Intgemm8 | MarianType::Intgemm16));
        if intgemm {
            // intgemm items are stored [out, in] already (transposed), embeddings too.
            return Ok((self.file.intgemm_dequantized(item)?, out, inputs));
        }
        let values = self.file.float_values(item)?;
        if is_embedding(item) {
            Ok((values, out, inputs))
        } else {
            Ok((transpose(&values, inputs, out), out, inputs))
        }
    }

    fn quantized_matrix(&self, items: &[String]) -> Result<Option<Quantized<'_>>> {
        if !items.iter().all(|i| self.file.get(i).is_some_and(|it| it.item_type == MarianType::Intgemm8)) {
            return Ok(None);
        }
        // One item's values are borrowed from the file; fused ones are concatenated.
        let mut values = Cow::Borrowed(&[][..]);
        let mut scales = Vec::new();
        let mut activation_scale: Option<f32> = None;
        for item in items {
            let (q, quant_mult) = self.file.intgemm8(item)?;
            match values.is_empty() {
                true => values = Cow::Borrowed(q),
                false => values.to_mut().extend_from_slice(q),
            }
            scales.extend(std::iter::repeat_n(quant_mult, q.len() / self.in_dim(item)?.max(1)));
            if self.alphas {
                let alpha = self.file.quant_mult_a(&alpha_name(item))?;
                // Fused products share one input, so their scales are the same; the first
                // one is used when a model disagrees.
                activation_scale = activation_scale.or(alpha);
            }
        }
        let intgemm = self.alphas && activation_scale.is_some();
        Ok(Some(Quantized::Int8 { values, scales, activation_scale, intgemm }))
    }

}

/// Matrices stored `[out, in]`: embeddings (`[vocabulary, d]`) and the transposed output
/// layer `decoder_ff_logit_out_Wt`; every other Marian matrix is `[in, out]`.
fn is_embedding(item: &str) -> bool {
    item.ends_with("Wemb") || item == "decoder_ff_logit_out_Wt"
}

/// The activation scale of a weight: `<name>_QuantMultA`, and Marian's name for the output
/// layer's (tied to the embeddings): `none_QuantMultA`.
fn alpha_name(item: &str) -> String {
    if item.ends_with("Wemb") {
        "none_QuantMultA".into()
    } else {
        format!("{item}_QuantMultA")
    }
}

/// `encoder_l1_self_Wq` -> `encoder_l1_self_bq`; `..._W1` -> `..._b1`; `rnn_Wf` -> `rnn_bf`.
fn bias_name(weight: &str) -> String {
    match weight.rfind("_W") {
        Some(i) => format!("{}_b{}", &weight[..i], &weight[i + 2..]),
        None => format!("{weight}_b"),
    }
}

fn transpose(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; values.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = values[r * cols + c];
        }
    }
    out
}

impl WeightSource for MarianWeights<'_> {
    fn file_name(&self) -> &str {
        "Marian model"
    }
    fn variable_names(&self) -> Vec<String> {
        self.variables.keys().cloned().collect()
    }
    fn stored_name(&self, name: &str) -> Option<String> {
        self.resolve(name).map(|(n, _)| n.to_string())
    }
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        match self.resolve(name)?.1 {
            Source::Matrix(items) => {
                let out: usize = items.iter().map(|i| self.out_dim(i).ok()).sum::<Option<usize>>()?;
                Some(vec![out, self.in_dim(&items[0]).ok()?])
            }
            Source::Vector(parts) => {
                let len = parts
                    .iter()
                    .map(|(item, len)| match item {
                        Some(i) => self.file.get(i).map(|it| it.elements()),
                        None => Some(*len),
                    })
                    .sum::<Option<usize>>()?;
                Some(vec![len])
            }
            Source::Scalar(_) => Some(vec![]),
        }
    }
    fn is_shared(&self, stored: &str) -> bool {
        self.aliases.values().any(|target| target == stored)
    }
    fn tensor(&self, name: &str) -> Result<Tensor> {
        let shape = self.shape(name).ok_or_else(|| Error::invalid_model(format!("Marian model: missing variable {name:?}")))?;
        let (_, source) = self.resolve(name).ok_or_else(|| Error::invalid_model(format!("Marian model: missing variable {name:?}")))?;
        let data = match source {
            Source::Matrix(items) => {
                let mut data = Vec::new();
                for item in items {
                    let (values, _, inp) = self.matrix_values(item)?;
                    if inp != shape[1] {
                        return Err(Error::invalid_model(format!("Marian model: {item} does not take {} inputs", shape[1])));
                    }
                    data.extend(values);
                }
                data
            }
            Source::Vector(parts) => {
                let mut data = Vec::new();
                for (item, len) in parts {
                    match item {
                        Some(i) => data.extend(self.file.float_values(i)?),
                        None => data.extend(std::iter::repeat_n(0.0, *len)),
                    }
                }
                data
            }
            Source::Scalar(v) => vec![*v as f32],
        };
        Ok(Tensor::from_vec(data, shape))
    }
    fn quantized(&self, name: &str) -> Result<Option<Quantized<'_>>> {
        match self.resolve(name) {
            Some((_, Source::Matrix(items))) => self.quantized_matrix(items),
            Some(_) => Ok(None),
            None => Err(Error::invalid_model(format!("Marian model: missing variable {name:?}"))),
        }
    }
    fn scalar(&self, name: &str) -> Result<Option<f64>> {
        match self.resolve(name) {
            Some((_, Source::Scalar(v))) => Ok(Some(*v)),
            Some(_) => Err(Error::invalid_model(format!("Marian model: {name:?} is not a scalar"))),
            None => Ok(None),
        }
    }
    fn is_flag(&self, _name: &str) -> bool {
        false
    }
    fn float_order(&self) -> FloatOrder {
        FloatOrder::Marian
    }
    fn saved_precision(&self) -> SavedPrecision {
        let types: Vec<MarianType> = self.file.items().iter().filter(|i| i.shape.len() == 2 && i.elements() > 1).map(|i| i.item_type).collect();
        if types.contains(&MarianType::Intgemm8) {
            SavedPrecision::Int8
        } else if types.contains(&MarianType::Intgemm16) {
            SavedPrecision::Int16
        } else {
            SavedPrecision::Float
        }
    }
}

