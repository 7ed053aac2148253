//! The Transformer encoder-decoder of CTranslate2's `TransformerSpec`, built from the
//! weights by name, for any compute backend. The model is immutable; everything a
//! translation mutates lives in `EncoderOutput` and `DecoderState`, in the backend's buffers.
use crate::backend::{Activation, AttentionShape, Backend, Ctx, KvCacheType, SequenceLayout, TopLogits};
use crate::error::{Error, Result};
use crate::model::attention::{AverageAttention, CrossAttention, FeedForward, Scratch, SelfAttention, Ssru};
use crate::model::layers::{embeddings_scale, EmbeddingTable, Linear, Norm, Positions, WeightReader};
use crate::model::{DecoderSession, Sources};

/// Options shared by the layers of one stack.
struct StackOptions {
    attention: AttentionShape,
    pre_norm: bool,
}

pub struct EncoderLayer<B: Backend> {
    self_attention: SelfAttention<B>,
    ffn: FeedForward<B>,
}

pub struct Encoder<B: Backend> {
    backend: B,
    embeddings: EmbeddingTable<B>,
    scale: Option<f32>,
    positions: Positions<B>,
    layernorm_embedding: Option<Norm<B>>,
    layers: Vec<EncoderLayer<B>>,
    final_norm: Option<Norm<B>>,
    opts: StackOptions,
}

/// What a decoder layer attends to its own past with.
enum DecoderSelfAttention<B: Backend> {
    /// Multi-head self-attention over cached keys and values.
    Attention(SelfAttention<B>),
    /// A simpler simple recurrent unit (Marian's `dec-cell: ssru`): one state vector per row.
    Ssru(Ssru<B>),
    /// Marian's average attention: the running average of the inputs, one vector per row.
    Average(AverageAttention<B>),
}

pub struct DecoderLayer<B: Backend> {
    self_attention: DecoderSelfAttention<B>,
    cross_attention: CrossAttention<B>,
    ffn: FeedForward<B>,
}

pub struct Decoder<B: Backend> {
    backend: B,
    embeddings: EmbeddingTable<B>,
    scale: Option<f32>,
    zero_start_embedding: bool,
    positions: Positions<B>,
    layernorm_embedding: Option<Norm<B>>,
    layers: Vec<DecoderLayer<B>>,
    final_norm: Option<Norm<B>>,
    projection: Linear<B>,
    opts: StackOptions,
    /// CTranslate2's alignment attention (`return_attention`): the cross-attention of this
    /// layer, averaged over its first heads (`decoder/alignment_layer`, default the last;
    /// `decoder/alignment_heads`, default 1).
    alignment: Alignment,
}

/// Which cross-attention probabilities a step returns as its alignment attention.
#[derive(Debug, Clone, Copy)]
struct Alignment {
    layer: usize,
    heads: usize,
}

fn read_activation<B: Backend>(w: &WeightReader<B>, scope: &str) -> Result<Activation> {
    read_activation_or(w, scope, 0.0)
}

/// [`read_activation`] with another default id (`default` when the model stores none).
pub(super) fn read_activation_or<B: Backend>(w: &WeightReader<B>, scope: &str, default: f64) -> Result<Activation> {
    let stored = w.scalar(&format!("{scope}/activation"))?.unwrap_or(default);
    // A fractional id names no activation (`as i64` made 1.5 the gelu of 1).
    Some(stored as i64)
        .filter(|_| stored.fract() == 0.0)
        .and_then(Activation::from_ct2_id)
        .ok_or_else(|| Error::unsupported(format!("{scope}: activation #{stored} is not supported (relu, gelu, gelu-tanh, gelu-sigmoid, swish, tanh are)")))
}

fn read_stack_options<B: Backend>(w: &WeightReader<B>, scope: &str, d: usize) -> Result<StackOptions> {
    let num_heads = w.scalar(&format!("{scope}/num_heads"))?.unwrap_or(8.0);
    if !(num_heads >= 1.0 && num_heads.fract() == 0.0 && num_heads <= d as f64 && d.is_multiple_of(num_heads as usize)) {
        return Err(Error::invalid_model(format!("{scope}: {num_heads} attention heads do not divide the model dimension {d}")));
    }
    Ok(StackOptions {
        attention: AttentionShape { num_heads: num_heads as usize, dim: d, order: w.float_order() },
        pre_norm: w.flag(&format!("{scope}/pre_norm"), true)?,
    })
}

fn count_layers<B: Backend>(w: &WeightReader<B>, scope: &str) -> usize {
    (0..).take_while(|i| w.contains(&format!("{scope}/layer_{i}/ffn/linear_0/weight"))).count()
}

/// The output projection that shared-vocabulary models tie their embeddings to.
const PROJECTION: &str = "decoder/projection/weight";

impl<B: Backend> Encoder<B> {
    pub fn load(w: &WeightReader<B>, eps: Option<f32>) -> Result<Self> {
        let scope = "encoder";
        if w.contains("encoder/embeddings_1/weight") {
            return Err(Error::unsupported("models with several source features (source factors) are not supported"));
        }
        let name = if w.contains("encoder/embeddings_0/weight") { "encoder/embeddings_0/weight" } else { "encoder/embeddings/weight" };
        let embeddings = EmbeddingTable::load(w, name, PROJECTION)?;
        let d = embeddings.dim();
        let opts = read_stack_options(w, scope, d)?;
        let activation = read_activation(w, scope)?;
        let n = count_layers(w, scope);
        if n == 0 {
            return Err(Error::invalid_model(format!("{}: the encoder has no layers", w.file_name())));
        }
        let mut layers = Vec::with_capacity(n);
        for i in 0..n {
            let s = format!("{scope}/layer_{i}");
            layers.push(EncoderLayer {
                self_attention: SelfAttention::load(w, &format!("{s}/self_attention"), d, eps)?,
                ffn: FeedForward::load(w, &format!("{s}/ffn"), d, eps, activation)?,
            });
        }
        Ok(Encoder {
            backend: w.backend().clone(),
            scale: embeddings_scale(w, scope, d)?,
            positions: Positions::load(w, scope, d)?,
            layernorm_embedding: optional_norm(w, "encoder/layernorm_embedding", d, eps)?,
            final_norm: optional_norm(w, "encoder/layer_norm", d, eps)?,
            embeddings,
            layers,
            opts,
        })
    }

    pub fn vocabulary_size(&self) -> usize {
        self.embeddings.rows()
    }

    /// The width of its outputs, which the decoder's attention reads.
    pub fn model_dim(&self) -> usize {
        self.embeddings.dim()
    }

    pub fn max_positions(&self) -> Option<usize> {
        self.positions.max_positions()
    }

    /// Encodes a batch of id sequences. Rows of all sequences are concatenated (no padding).
    pub fn forward(&self, ctx: &Ctx, sources: Sources<'_>) -> EncoderOutput<B> {
        let b = &self.backend;
        let d = self.embeddings.dim();
        let sequences = sources.ids;
        let mut layout = SequenceLayout::new(sequences.iter().map(Vec::len).collect());
        layout.padded.iter_mut().for_each(|p| *p = (*p).max(sources.padded));
        let ids: Vec<u32> = sequences.iter().flatten().copied().collect();
        let positions: Vec<usize> = sequences.iter().flat_map(|s| 0..s.len()).collect();
        let mut x = B::Buffer::default();
        self.embeddings.lookup(b, &ids, self.scale, &mut x);
        self.positions.add(b, &mut x, d, &positions);
        if let Some(norm) = &self.layernorm_embedding {
            norm.forward(b, &mut x);
        }
        let mut scratch = Scratch::default();
        for layer in &self.layers {
            self.self_attention(ctx, &layer.self_attention, &mut x, &layout, &mut scratch);
            layer.ffn.forward_in_parts(b, ctx, &mut x, ids.len(), self.opts.pre_norm, &mut scratch);
        }
        if let Some(norm) = &self.final_norm {
            norm.forward(b, &mut x);
        }
        EncoderOutput { data: x, layout }
    }

    fn self_attention(&self, ctx: &Ctx, block: &SelfAttention<B>, x: &mut B::Buffer, layout: &SequenceLayout, scratch: &mut Scratch<B>) {
        let b = &self.backend;
        let rows = layout.total_rows();
        let input = if self.opts.pre_norm {
            b.copy(x, &mut scratch.normed);
            block.norm.forward(b, &mut scratch.normed);
            &scratch.normed
        } else {
            &*x
        };
        block.qkv.forward(b, ctx, input, rows, &mut scratch.hidden);
        b.sequence_attention(ctx, &scratch.hidden, layout, self.opts.attention, &mut scratch.context);
        block.out.forward(b, ctx, &scratch.context, rows, &mut scratch.proj);
        b.add(x, &scratch.proj);
        if !self.opts.pre_norm {
            block.norm.forward(b, x);
        }
    }
}

fn optional_norm<B: Backend>(w: &WeightReader<B>, scope: &str, d: usize, eps: Option<f32>) -> Result<Option<Norm<B>>> {
    if w.contains(&format!("{scope}/gamma")) {
        Norm::load(w, scope, d, eps).map(Some)
    } else {
        Ok(None)
    }
}

/// Encoder states of a batch, one row per source token, sequences concatenated.
pub struct EncoderOutput<B: Backend> {
    pub data: B::Buffer,
    pub layout: SequenceLayout,
}

/// The output layer of one batch restricted to a vocabulary subset (a shortlist).
struct OutputSubset<B: Backend> {
    ids: Vec<u32>,
    projection: Linear<B>,
}

/// What a decoder layer carries between steps for its rows.
enum LayerState<B: Backend> {
    /// Self-attention keys and values of every step.
    Cache(B::KvCache),
    /// SSRU cell states or running averages: [rows, d].
    Cells(B::Buffer),
}

/// What the decoder carries between steps for the rows (hypotheses) being decoded.
pub struct DecoderState<B: Backend> {
    /// For each row, the batch example whose encoder output it attends to.
    row_example: Vec<usize>,
    layers: Vec<LayerState<B>>,
    output: Option<OutputSubset<B>>,
    /// Cross-attention keys and values per layer, computed once for each example's source
    /// positions, stored as `kv` (then `kv.row_slots(2d, head_dim)` floats a position).
    memory_kv: Vec<B::MemoryKv>,
    /// How this decoding keeps its keys and values (cross-attention's and the cache's).
    kv: KvCacheType,
    memory: SequenceLayout,
    /// Steps each row has decoded (rows appended later started later).
    steps: Vec<usize>,
    scratch: Scratch<B>,
    x: B::Buffer,
    logits: B::Buffer,
    /// The last step's alignment attention per row, when kept (`keep_attention`).
    attention: Option<Vec<Vec<f32>>>,
}

impl<B: Backend> DecoderState<B> {
    pub fn num_rows(&self) -> usize {
        self.row_example.len()
    }

    /// Appends the rows of `other`, a state of the same decoder for other examples, after
    /// this state's rows, all but the cross-attention keys/values (see
    /// `Decoder::append_examples`).
    fn append(&mut self, b: &B, other: DecoderState<B>) {
        debug_assert!(other.memory_kv.is_empty(), "the joining examples' keys/values are appended layer by layer");
        let examples = self.memory.lengths.len();
        self.row_example.extend(other.row_example.iter().map(|e| e + examples));
        for (mine, theirs) in self.layers.iter_mut().zip(other.layers) {
            match (mine, theirs) {
                (LayerState::Cache(mine), LayerState::Cache(theirs)) => b.append_kv_cache(mine, theirs),
                (LayerState::Cells(mine), LayerState::Cells(theirs)) => b.append_rows(mine, &theirs),
                _ => unreachable!("states of one decoder have the same layers"),
            }
        }
        self.memory.append(other.memory);
        self.steps.extend(other.steps);
    }
}

impl<B: Backend> Decoder<B> {
    pub fn load(w: &WeightReader<B>, eps: Option<f32>) -> Result<Self> {
        let scope = "decoder";
        let embeddings = EmbeddingTable::load(w, "decoder/embeddings/weight", PROJECTION)?;
        let d = embeddings.dim();
        let opts = read_stack_options(w, scope, d)?;
        let activation = read_activation(w, scope)?;
        let n = count_layers(w, scope);
        if n == 0 {
            return Err(Error::invalid_model(format!("{}: the decoder has no layers", w.file_name())));
        }
        if !w.contains("decoder/layer_0/attention/linear_0/weight") {
            return Err(Error::unsupported("decoders without encoder attention (language models) are not supported"));
        }
        let mut layers = Vec::with_capacity(n);
        for i in 0..n {
            let s = format!("{scope}/layer_{i}");
            let self_attention = if w.contains(&format!("{s}/ssru/linear_0/weight")) {
                DecoderSelfAttention::Ssru(Ssru::load(w, &format!("{s}/ssru"), d, eps)?)
            } else if w.contains(&format!("{s}/average_attention/layer_norm/gamma")) {
                DecoderSelfAttention::Average(AverageAttention::load(w, &format!("{s}/average_attention"), d, eps)?)
            } else {
                DecoderSelfAttention::Attention(SelfAttention::load(w, &format!("{s}/self_attention"), d, eps)?)
            };
            layers.push(DecoderLayer {
                self_attention,
                cross_attention: CrossAttention::load(w, &format!("{s}/attention"), d, eps)?,
                ffn: FeedForward::load(w, &format!("{s}/ffn"), d, eps, activation)?,
            });
        }
        let vocab = w.dims("decoder/projection/weight")?.first().copied().unwrap_or(0);
        let projection = Linear::load(w, "decoder/projection", vocab, d)?;
        let layer = w.scalar("decoder/alignment_layer")?.unwrap_or(-1.0);
        let layer = if layer < 0.0 { layer + n as f64 } else { layer };
        let heads = w.scalar("decoder/alignment_heads")?.unwrap_or(1.0);
        let num_heads = opts.attention.num_heads;
        if !(layer >= 0.0 && layer < n as f64 && heads >= 0.0 && heads <= num_heads as f64 && heads.fract() == 0.0) {
            return Err(Error::invalid_model(format!(
                "model.bin: decoder/alignment_layer and alignment_heads ({layer}, {heads}) are out of range for {n} layers of {num_heads} heads"
            )));
        }
        let alignment = Alignment { layer: layer as usize, heads: if heads == 0.0 { num_heads } else { heads as usize } };
        Ok(Decoder {
            backend: w.backend().clone(),
            scale: embeddings_scale(w, scope, d)?,
            zero_start_embedding: w.flag("decoder/start_from_zero_embedding", false)?,
            positions: Positions::load(w, scope, d)?,
            layernorm_embedding: optional_norm(w, "decoder/layernorm_embedding", d, eps)?,
            final_norm: optional_norm(w, "decoder/layer_norm", d, eps)?,
            embeddings,
            layers,
            projection,
            opts,
            alignment,
        })
    }

    pub fn vocabulary_size(&self) -> usize {
        self.projection.out_dim()
    }

    pub fn model_dim(&self) -> usize {
        self.embeddings.dim()
    }

    pub fn embeddings_size(&self) -> usize {
        self.embeddings.rows()
    }

    pub fn max_positions(&self) -> Option<usize> {
        self.positions.max_positions()
    }

    /// Prepares the state for one row per batch example; cross-attention keys/values are
    /// projected once here for every layer. With `output_ids` (sorted target ids), the
    /// output layer of this batch is restricted to them. Keys and values are kept as `kv`.
    pub fn initial_state(&self, ctx: &Ctx, memory: EncoderOutput<B>, output_ids: Option<Vec<u32>>, kv: KvCacheType) -> Result<DecoderState<B>> {
        let b = &self.backend;
        self.check_kv_type(kv)?;
        let vocabulary = self.vocabulary_size();
        let output = match output_ids {
            Some(ids) => {
                if ids.is_empty() || ids.windows(2).any(|w| w[0] >= w[1]) || ids.last().is_some_and(|&i| i as usize >= vocabulary) {
                    return Err(Error::invalid_argument(format!(
                        "an output vocabulary subset must be sorted, unique, non-empty ids below {vocabulary}"
                    )));
                }
                let projection = self.projection.select_rows(b, &ids);
                Some(OutputSubset { ids, projection })
            }
            None => None,
        };
        let mut memory_kv: Vec<B::MemoryKv> = self.layers.iter().map(|_| B::MemoryKv::default()).collect();
        self.append_memory_kv(ctx, &memory, kv, &mut memory_kv);
        Ok(self.state_of(memory.layout, memory_kv, output, kv))
    }

    /// Appends every layer's cross-attention keys/values of `memory`'s examples to that
    /// layer's `dst`, stored as `kv`. Where the backend multiplies a few hundred rows as
    /// fast as more (`feed_forward_rows`), a few examples at a time, their encoder rows
    /// copied out once for all layers: a batch of long sentences projects 6 MB a layer at
    /// once.
    fn append_memory_kv(&self, ctx: &Ctx, memory: &EncoderOutput<B>, kv: KvCacheType, dst: &mut [B::MemoryKv]) {
        let (b, d, lengths) = (&self.backend, self.embeddings.dim(), &memory.layout.lengths);
        let mut projected = B::Buffer::default();
        let mut project = |x: &B::Buffer, rows: usize, lengths: &[usize]| {
            for (layer, dst) in self.layers.iter().zip(dst.iter_mut()) {
                layer.cross_attention.kv.forward(b, ctx, x, rows, &mut projected);
                b.append_memory_kv(dst, &mut projected, lengths, 2 * d, kv, self.head_dim());
            }
        };
        let Some(limit) = b.feed_forward_rows() else {
            return project(&memory.data, memory.layout.total_rows(), lengths);
        };
        let mut part = B::Buffer::default();
        let (mut first, mut row) = (0, 0);
        while first < lengths.len() {
            // Examples up to `limit` rows (at least one).
            let mut end = first + 1;
            let mut rows = lengths[first];
            while end < lengths.len() && rows + lengths[end] <= limit {
                rows += lengths[end];
                end += 1;
            }
            b.copy_rows(&memory.data, d, row, rows, &mut part);
            project(&part, rows, &lengths[first..end]);
            (first, row) = (end, row + rows);
        }
    }

    /// Whether this decoder's backend keeps keys/values as `kv`.
    pub fn check_kv_type(&self, kv: KvCacheType) -> Result<()> {
        let b = &self.backend;
        if !b.stores_kv_as(kv) {
            return Err(Error::unsupported(format!("kv_cache_type {} is not supported on {} (float32 is)", kv.name(), b.name())));
        }
        Ok(())
    }

    /// Values per head: the piece each int8 scale of stored keys/values covers.
    fn head_dim(&self) -> usize {
        self.opts.attention.dim / self.opts.attention.num_heads.max(1)
    }

    /// Adds the examples of `memory` to `state` (continuous batching; the caller checks
    /// `can_append`): their rows after `state`'s, their cross-attention keys/values in
    /// each layer's memory (`append_memory_kv`).
    pub fn append_examples(&self, ctx: &Ctx, state: &mut DecoderState<B>, memory: EncoderOutput<B>) {
        self.append_memory_kv(ctx, &memory, state.kv, &mut state.memory_kv);
        let joining = self.state_of(memory.layout, Vec::new(), None, state.kv);
        state.append(&self.backend, joining);
    }

    /// A state for the examples of `memory`, no row decoded yet.
    fn state_of(&self, memory: SequenceLayout, memory_kv: Vec<B::MemoryKv>, output: Option<OutputSubset<B>>, kv: KvCacheType) -> DecoderState<B> {
        let b = &self.backend;
        let rows = memory.lengths.len();
        let d = self.embeddings.dim();
        let layers = self
            .layers
            .iter()
            .map(|l| match l.self_attention {
                DecoderSelfAttention::Ssru(_) | DecoderSelfAttention::Average(_) => {
                    let mut cells = B::Buffer::default();
                    b.zeros(&mut cells, rows, d);
                    LayerState::Cells(cells)
                }
                DecoderSelfAttention::Attention(_) => LayerState::Cache(b.new_kv_cache(rows, kv)),
            })
            .collect();
        DecoderState {
            row_example: (0..rows).collect(),
            layers,
            output,
            memory_kv,
            kv,
            memory,
            steps: vec![0; rows],
            scratch: Scratch::default(),
            x: B::Buffer::default(),
            logits: B::Buffer::default(),
            attention: None,
        }
    }

    /// Keeps rows `sources[i]` as the new row `i` (beam reordering, finished rows removed).
    pub fn select_rows(&self, state: &mut DecoderState<B>, sources: &[usize]) {
        let b = &self.backend;
        let d = self.embeddings.dim();
        for layer in &mut state.layers {
            match layer {
                LayerState::Cache(cache) => b.reorder_kv_cache(cache, sources),
                LayerState::Cells(cells) => b.reorder_rows(cells, d, sources),
            }
        }
        state.row_example = sources.iter().map(|&s| state.row_example[s]).collect();
        state.steps = sources.iter().map(|&s| state.steps[s]).collect();
        // Where dropping an example's keys/values moves nobody else's, at once.
        self.drop_finished_memory(state, if self.backend.drops_memory_kv_freely() { 0.0 } else { 0.5 });
    }

    /// Frees what the finished rows left: their cross-attention keys/values and the cache
    /// blocks kept for reuse (before a batch joins: its encoding needs the memory first).
    fn shrink(&self, state: &mut DecoderState<B>) {
        self.drop_finished_memory(state, 0.0);
        for layer in &mut state.layers {
            if let LayerState::Cache(cache) = layer {
                self.backend.shrink_kv_cache(cache);
            }
        }
    }

    /// Frees the cross-attention keys/values of the examples no row decodes any more, once
    /// they hold more than `share` of them (in a long continuous decoding they would pile up).
    fn drop_finished_memory(&self, state: &mut DecoderState<B>, share: f32) {
        let examples = state.memory.lengths.len();
        let mut live = vec![false; examples];
        for &e in &state.row_example {
            live[e] = true;
        }
        let kept: Vec<usize> = (0..examples).filter(|&e| live[e]).collect();
        let (live_rows, total) = (kept.iter().map(|&e| state.memory.lengths[e]).sum::<usize>(), state.memory.total_rows());
        if total - live_rows == 0 || ((total - live_rows) as f32) < share * total as f32 {
            return;
        }
        let slots = state.kv.row_slots(2 * self.embeddings.dim(), self.head_dim());
        for kv in &mut state.memory_kv {
            self.backend.keep_memory_kv(kv, &state.memory, &kept, slots);
        }
        let (layout, _) = state.memory.select(&kept);
        let mut renumbered = vec![0; examples];
        for (i, &e) in kept.iter().enumerate() {
            renumbered[e] = i;
        }
        state.row_example.iter_mut().for_each(|e| *e = renumbered[*e]);
        state.memory = layout;
    }

    /// Whether states of this decoder can take rows of another batch (continuous
    /// batching): not with an output subset (its columns belong to one batch), nor with
    /// average attention (its running average counts one step for all rows).
    pub fn can_append(&self, state: &DecoderState<B>) -> bool {
        state.output.is_none() && self.takes_rows_in()
    }

    /// [`Decoder::can_append`] for states without an output subset.
    pub fn takes_rows_in(&self) -> bool {
        self.backend.can_append_rows() && self.layers.iter().all(|l| !matches!(l.self_attention, DecoderSelfAttention::Average(_)))
    }

    /// Bytes one position of one row takes in a state's keys/values, all layers: the
    /// cross-attention's per source position, the self-attention cache's per step.
    pub fn position_bytes(&self, kv: KvCacheType) -> usize {
        let slots = kv.row_slots(2 * self.embeddings.dim(), self.head_dim());
        self.layers.len() * slots * std::mem::size_of::<f32>()
    }

    /// Runs one decoding step for every row of `state` with input `ids` (one per row) and
    /// writes the logits [rows, vocabulary] into `logits` on the host.
    pub fn step(&self, ctx: &Ctx, ids: &[u32], state: &mut DecoderState<B>, logits: &mut Vec<f32>) {
        let x = self.step_layers(ctx, ids, state);
        let projection = state.output.as_ref().map_or(&self.projection, |o| &o.projection);
        projection.forward_to_host(&self.backend, ctx, &x, ids.len(), &mut state.logits, logits);
        state.x = x;
    }

    /// [`Decoder::step`] when only each row's largest logit matters (greedy search without
    /// scores): its column and value into `best` (columns `disabled[row]` counted as
    /// `f32::MIN`) and `true` where the backend finds them without writing the logits out,
    /// else the logits into `logits` and `false`.
    pub fn step_best(
        &self,
        ctx: &Ctx,
        ids: &[u32],
        state: &mut DecoderState<B>,
        disabled: &[&[u32]],
        logits: &mut Vec<f32>,
        best: &mut Vec<(usize, f32)>,
    ) -> bool {
        let rows = ids.len();
        let found = self.step_finding(ctx, ids, state, logits, |projection, x| projection.best_outputs(&self.backend, ctx, x, rows, disabled));
        found.map(|found| *best = found).is_some()
    }

    /// [`Decoder::step`] when each row's `k` best logits and its log-sum-exp are enough
    /// (beam search): into `top` and `true` where the backend finds them without handing
    /// the logits over, else the logits into `logits` and `false`.
    #[allow(clippy::too_many_arguments)]
    pub fn step_top(
        &self,
        ctx: &Ctx,
        ids: &[u32],
        state: &mut DecoderState<B>,
        disabled: &[&[u32]],
        k: usize,
        logits: &mut Vec<f32>,
        top: &mut TopLogits,
    ) -> bool {
        let rows = ids.len();
        let found = self.step_finding(ctx, ids, state, logits, |projection, x| projection.top_outputs(&self.backend, ctx, x, rows, disabled, k));
        found.map(|found| *top = found).is_some()
    }

    /// The layers of one step, then `find` on the output layer; where it finds nothing
    /// (the backend cannot without the whole output), the logits go to `logits`.
    fn step_finding<T>(
        &self,
        ctx: &Ctx,
        ids: &[u32],
        state: &mut DecoderState<B>,
        logits: &mut Vec<f32>,
        find: impl FnOnce(&Linear<B>, &B::Buffer) -> Option<T>,
    ) -> Option<T> {
        let x = self.step_layers(ctx, ids, state);
        let projection = state.output.as_ref().map_or(&self.projection, |o| &o.projection);
        let found = find(projection, &x);
        if found.is_none() {
            projection.forward_to_host(&self.backend, ctx, &x, ids.len(), &mut state.logits, logits);
        }
        state.x = x;
        found
    }

    /// The layers of one step: the rows' final hidden states (`state.x`'s buffer, to be
    /// handed back there).
    fn step_layers(&self, ctx: &Ctx, ids: &[u32], state: &mut DecoderState<B>) -> B::Buffer {
        let b = &self.backend;
        let d = self.embeddings.dim();
        let rows = ids.len();
        debug_assert_eq!(rows, state.num_rows());
        let mut x = std::mem::take(&mut state.x);
        let first_steps: Vec<usize> = if self.zero_start_embedding {
            (0..rows).filter(|&r| state.steps[r] == 0).collect()
        } else {
            Vec::new()
        };
        if !first_steps.is_empty() && first_steps.len() == rows {
            // Marian starts decoding from a zero vector instead of the <s> embedding.
            b.zeros(&mut x, rows, d);
        } else {
            self.embeddings.lookup(b, ids, self.scale, &mut x);
            if !first_steps.is_empty() {
                // Rows that joined later (continuous batching) on their first step.
                b.zero_rows(&mut x, d, &first_steps);
            }
        }
        self.positions.add(b, &mut x, d, &state.steps);
        if let Some(norm) = &self.layernorm_embedding {
            norm.forward(b, &mut x);
        }
        let mut scratch = std::mem::take(&mut state.scratch);
        for (l, layer) in self.layers.iter().enumerate() {
            match (&layer.self_attention, &mut state.layers[l]) {
                (DecoderSelfAttention::Attention(block), LayerState::Cache(cache)) => {
                    self.self_attention_step(ctx, block, &mut x, rows, cache, &mut scratch)
                }
                (DecoderSelfAttention::Ssru(block), LayerState::Cells(cells)) => self.ssru_step(ctx, block, &mut x, rows, cells, &mut scratch),
                (DecoderSelfAttention::Average(block), LayerState::Cells(average)) => {
                    // One step for all rows: states with average attention take no rows in.
                    let step = state.steps.first().copied().unwrap_or(0);
                    self.average_attention_step(ctx, block, &mut x, rows, average, step, &mut scratch)
                }
                _ => unreachable!("decoder layer states are made by initial_state for these layers"),
            }
            self.cross_attention_step(ctx, l, &layer.cross_attention, &mut x, state, &mut scratch);
            if l == self.alignment.layer && state.attention.is_some() {
                let (kv, shape) = (&state.memory_kv[l], self.opts.attention);
                state.attention = b.memory_attention_weights(ctx, &scratch.query, kv, state.kv, &state.memory, &state.row_example, shape, self.alignment.heads);
            }
            layer.ffn.forward(b, ctx, &mut x, rows, self.opts.pre_norm, &mut scratch);
        }
        if let Some(norm) = &self.final_norm {
            norm.forward(b, &mut x);
        }
        state.scratch = scratch;
        state.steps.iter_mut().for_each(|s| *s += 1);
        x
    }

    /// The sub-layer's input: `x`, or with pre-norm its normalized copy in `buf`.
    fn normed_input<'a>(&self, norm: &Norm<B>, x: &'a B::Buffer, buf: &'a mut B::Buffer) -> &'a B::Buffer {
        if self.opts.pre_norm {
            self.backend.copy(x, buf);
            norm.forward(&self.backend, buf);
            buf
        } else {
            x
        }
    }

    /// The residual connection, then the norm with post-norm.
    fn finish_block(&self, norm: &Norm<B>, x: &mut B::Buffer, proj: &B::Buffer) {
        self.backend.add(x, proj);
        if !self.opts.pre_norm {
            norm.forward(&self.backend, x);
        }
    }

    fn self_attention_step(&self, ctx: &Ctx, block: &SelfAttention<B>, x: &mut B::Buffer, rows: usize, cache: &mut B::KvCache, scratch: &mut Scratch<B>) {
        let b = &self.backend;
        let input = self.normed_input(&block.norm, x, &mut scratch.normed);
        block.qkv.forward(b, ctx, input, rows, &mut scratch.hidden);
        b.cached_attention(ctx, &scratch.hidden, cache, self.opts.attention, &mut scratch.context);
        block.out.forward(b, ctx, &scratch.context, rows, &mut scratch.proj);
        self.finish_block(&block.norm, x, &scratch.proj);
    }

    /// `c = f * c + (1 - f) * (W x)` with `f = sigmoid(Wf x + bf)`, output `relu(c)`, then
    /// the residual and norm like any sub-layer.
    fn ssru_step(&self, ctx: &Ctx, block: &Ssru<B>, x: &mut B::Buffer, rows: usize, cells: &mut B::Buffer, scratch: &mut Scratch<B>) {
        let b = &self.backend;
        let input = self.normed_input(&block.norm, x, &mut scratch.normed);
        block.input.forward(b, ctx, input, rows, &mut scratch.hidden);
        block.forget.forward(b, ctx, input, rows, &mut scratch.query);
        b.ssru(cells, &scratch.hidden, &scratch.query, &mut scratch.proj);
        self.finish_block(&block.norm, x, &scratch.proj);
    }

    /// `g = (g * t + x) / (t + 1)` (the average of the inputs so far), `y = FFN(g)`, gated
    /// `y = sigmoid(Wi x + bi) * x + sigmoid(Wf y + bf) * y`, then residual and norm.
    #[allow(clippy::too_many_arguments)]
    fn average_attention_step(
        &self,
        ctx: &Ctx,
        block: &AverageAttention<B>,
        x: &mut B::Buffer,
        rows: usize,
        average: &mut B::Buffer,
        step: usize,
        scratch: &mut Scratch<B>,
    ) {
        let b = &self.backend;
        b.running_average(average, x, step);
        let y = &mut scratch.normed;
        b.copy(average, y);
        if self.opts.pre_norm {
            block.norm.forward(b, y);
        }
        for layer in &block.hidden {
            layer.forward(b, ctx, y, rows, &mut scratch.hidden);
            b.activation(ctx, &mut scratch.hidden, block.activation);
            std::mem::swap(y, &mut scratch.hidden);
        }
        if let Some(projection) = &block.projection {
            projection.forward(b, ctx, y, rows, &mut scratch.hidden);
            std::mem::swap(y, &mut scratch.hidden);
        }
        if let Some((input_gate, forget_gate)) = &block.gate {
            input_gate.forward(b, ctx, x, rows, &mut scratch.query);
            forget_gate.forward(b, ctx, y, rows, &mut scratch.context);
            b.gate(y, x, &scratch.query, &scratch.context);
        }
        std::mem::swap(&mut scratch.proj, y);
        self.finish_block(&block.norm, x, &scratch.proj);
    }

    fn cross_attention_step(&self, ctx: &Ctx, layer: usize, block: &CrossAttention<B>, x: &mut B::Buffer, state: &DecoderState<B>, scratch: &mut Scratch<B>) {
        let b = &self.backend;
        let rows = state.num_rows();
        let input = self.normed_input(&block.norm, x, &mut scratch.normed);
        block.query.forward(b, ctx, input, rows, &mut scratch.query);
        let kv = &state.memory_kv[layer];
        b.memory_attention(ctx, &scratch.query, kv, state.kv, &state.memory, &state.row_example, self.opts.attention, &mut scratch.context);
        block.out.forward(b, ctx, &scratch.context, rows, &mut scratch.proj);
        self.finish_block(&block.norm, x, &scratch.proj);
    }
}

/// A batch being decoded by a [`Decoder`].
pub struct TransformerSession<'a, B: Backend> {
    pub(crate) encoder: &'a Encoder<B>,
    pub(crate) decoder: &'a Decoder<B>,
    pub(crate) state: DecoderState<B>,
}

impl<B: Backend> DecoderSession for TransformerSession<'_, B> {
    fn vocabulary_size(&self) -> usize {
        self.state.output.as_ref().map_or(self.decoder.vocabulary_size(), |o| o.ids.len())
    }
    fn output_ids(&self) -> Option<&[u32]> {
        self.state.output.as_ref().map(|o| o.ids.as_slice())
    }
    fn step(&mut self, ctx: &Ctx, ids: &[u32], logits: &mut Vec<f32>) {
        self.decoder.step(ctx, ids, &mut self.state, logits)
    }
    fn step_best(&mut self, ctx: &Ctx, ids: &[u32], disabled: &[&[u32]], logits: &mut Vec<f32>, best: &mut Vec<(usize, f32)>) -> bool {
        self.decoder.step_best(ctx, ids, &mut self.state, disabled, logits, best)
    }
    fn step_top(&mut self, ctx: &Ctx, ids: &[u32], disabled: &[&[u32]], k: usize, logits: &mut Vec<f32>, top: &mut TopLogits) -> bool {
        self.decoder.step_top(ctx, ids, &mut self.state, disabled, k, logits, top)
    }
    fn select_rows(&mut self, rows: &[usize]) {
        self.decoder.select_rows(&mut self.state, rows)
    }
    fn keep_attention(&mut self) -> bool {
        let gives = self.decoder.backend.gives_attention_weights();
        if gives && self.state.attention.is_none() {
            self.state.attention = Some(Vec::new());
        }
        gives
    }
    fn step_attention(&self) -> &[Vec<f32>] {
        self.state.attention.as_deref().unwrap_or(&[])
    }
    fn row_lengths(&self) -> Vec<(usize, usize)> {
        let state = &self.state;
        state.row_example.iter().zip(&state.steps).map(|(&e, &steps)| (state.memory.lengths[e], steps)).collect()
    }
    fn append_sources(&mut self, ctx: &Ctx, sources: Sources<'_>, release_freed: bool) -> Result<bool> {
        if !self.decoder.can_append(&self.state) {
            return Ok(false);
        }
        // The finished examples' keys/values go first: the new ones take their place.
        self.decoder.shrink(&mut self.state);
        if release_freed {
            crate::release_free_memory();
        }
        let memory = self.encoder.forward(ctx, sources);
        self.decoder.append_examples(ctx, &mut self.state, memory);
        Ok(true)
    }
}
