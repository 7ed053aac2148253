//! The Transformer encoder-decoder of CTranslate2's `TransformerSpec`, built from the
//! weights by name. The model is immutable; everything a translation mutates lives in
//! `EncoderOutput` and `DecoderState`.
use crate::backend::cpu::attention::{attend_row, attend_row_padded, attend_row_sequential, KvView};
use crate::backend::FloatOrder;
use crate::backend::cpu::{ops, Ctx};
use crate::error::{Error, Result};
use crate::model::attention::{AverageAttention, CrossAttention, FeedForward, Scratch, SelfAttention, Ssru};
use crate::model::layers::{embeddings_scale, EmbeddingTable, Linear, Norm, Positions, WeightReader};
use crate::model::DecoderSession;

/// Options shared by the layers of one stack.
struct StackOptions {
    num_heads: usize,
    pre_norm: bool,
    float_order: FloatOrder,
}

pub struct EncoderLayer {
    self_attention: SelfAttention,
    ffn: FeedForward,
}

pub struct Encoder {
    embeddings: EmbeddingTable,
    scale: Option<f32>,
    positions: Positions,
    layernorm_embedding: Option<Norm>,
    layers: Vec<EncoderLayer>,
    final_norm: Option<Norm>,
    opts: StackOptions,
}

/// What a decoder layer attends to its own past with.
enum DecoderSelfAttention {
    /// Multi-head self-attention over cached keys and values.
    Attention(SelfAttention),
    /// A simpler simple recurrent unit (Marian's `dec-cell: ssru`): one state vector per row.
    Ssru(Ssru),
    /// Marian's average attention: the running average of the inputs, one vector per row.
    Average(AverageAttention),
}

pub struct DecoderLayer {
    self_attention: DecoderSelfAttention,
    cross_attention: CrossAttention,
    ffn: FeedForward,
}

pub struct Decoder {
    embeddings: EmbeddingTable,
    scale: Option<f32>,
    zero_start_embedding: bool,
    positions: Positions,
    layernorm_embedding: Option<Norm>,
    layers: Vec<DecoderLayer>,
    final_norm: Option<Norm>,
    projection: Linear,
    opts: StackOptions,
}

fn read_activation(w: &WeightReader, scope: &str) -> Result<ops::Activation> {
    let id = w.scalar(&format!("{scope}/activation"))?.unwrap_or(0.0) as i64;
    ops::Activation::from_ct2_id(id)
        .ok_or_else(|| Error::unsupported(format!("{scope}: activation #{id} is not supported (relu, gelu, gelu-tanh, gelu-sigmoid, swish, tanh are)")))
}

fn read_stack_options(w: &WeightReader, scope: &str, d: usize) -> Result<StackOptions> {
    let num_heads = w.scalar(&format!("{scope}/num_heads"))?.unwrap_or(8.0);
    if !(num_heads >= 1.0 && num_heads <= d as f64 && d % num_heads as usize == 0) {
        return Err(Error::invalid_model(format!("{scope}: {num_heads} attention heads do not divide the model dimension {d}")));
    }
    Ok(StackOptions {
        num_heads: num_heads as usize,
        pre_norm: w.flag(&format!("{scope}/pre_norm"), true)?,
        float_order: w.float_order(),
    })
}

fn count_layers(w: &WeightReader, scope: &str) -> usize {
    (0..).take_while(|i| w.contains(&format!("{scope}/layer_{i}/ffn/linear_0/weight"))).count()
}

/// The output projection that shared-vocabulary models tie their embeddings to.
const PROJECTION: &str = "decoder/projection/weight";

impl Encoder {
    pub fn load(w: &WeightReader, eps: Option<f32>) -> Result<Encoder> {
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
            return Err(Error::invalid_model("model.bin: the encoder has no layers"));
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

    pub fn max_positions(&self) -> Option<usize> {
        self.positions.max_positions()
    }

    /// Encodes a batch of id sequences. Rows of all sequences are concatenated (no padding).
    pub fn forward(&self, ctx: &Ctx, sequences: &[Vec<u32>]) -> EncoderOutput {
        let d = self.embeddings.dim();
        let mut offsets = Vec::with_capacity(sequences.len());
        let mut total = 0;
        for s in sequences {
            offsets.push(total);
            total += s.len();
        }
        let mut x = vec![0.0f32; total * d];
        for (seq, &off) in sequences.iter().zip(&offsets) {
            for (t, &id) in seq.iter().enumerate() {
                let row = &mut x[(off + t) * d..(off + t + 1) * d];
                self.embeddings.lookup(id as usize, self.scale, row);
                self.positions.add(t, row);
            }
        }
        if let Some(norm) = &self.layernorm_embedding {
            norm.forward(&mut x);
        }
        let lengths: Vec<usize> = sequences.iter().map(Vec::len).collect();
        let mut scratch = Scratch::default();
        for layer in &self.layers {
            self.self_attention(ctx, &layer.self_attention, &mut x, &offsets, &lengths, &mut scratch);
            layer.ffn.forward(ctx, &mut x, total, self.opts.pre_norm, &mut scratch);
        }
        if let Some(norm) = &self.final_norm {
            norm.forward(&mut x);
        }
        EncoderOutput { data: x, offsets, lengths, dim: d }
    }

    fn self_attention(
        &self,
        ctx: &Ctx,
        block: &SelfAttention,
        x: &mut [f32],
        offsets: &[usize],
        lengths: &[usize],
        scratch: &mut Scratch,
    ) {
        let d = self.embeddings.dim();
        let rows = x.len() / d;
        let heads = self.opts.num_heads;
        let head_dim = d / heads;
        let scale = 1.0 / (head_dim as f32).sqrt();
        let input: &[f32] = if self.opts.pre_norm {
            scratch.normed.clear();
            scratch.normed.extend_from_slice(x);
            block.norm.forward(&mut scratch.normed);
            &scratch.normed
        } else {
            x
        };
        let mut qkv = std::mem::take(&mut scratch.hidden);
        block.qkv.forward(ctx, input, rows, &mut qkv);
        scratch.context.clear();
        scratch.context.resize(rows * d, 0.0);
        // Marian multiplies the batch padded to its longest source: Eigen's kernel then sums
        // the keys past the last multiple of 4 of that length otherwise, for the query rows
        // before it.
        let whole = lengths.iter().copied().max().unwrap_or(0) / 4 * 4;
        for (&off, &len) in offsets.iter().zip(lengths) {
            let seq = &qkv[off * 3 * d..(off + len) * 3 * d];
            let keys = KvView { data: seq, stride: 3 * d, offset: d };
            let values = KvView { data: seq, stride: 3 * d, offset: 2 * d };
            for t in 0..len {
                let q = &seq[t * 3 * d..t * 3 * d + d];
                let out = &mut scratch.context[(off + t) * d..(off + t + 1) * d];
                match self.opts.float_order {
                    FloatOrder::Ctranslate2 => attend_row(q, keys, values, len, heads, head_dim, scale, false, &mut scratch.scores, out),
                    FloatOrder::Marian => {
                        let peeled = if t < whole { whole } else { usize::MAX };
                        attend_row_sequential(q, keys, values, len, peeled, heads, head_dim, scale, &mut scratch.scores, out)
                    }
                }
            }
        }
        scratch.hidden = qkv;
        block.out.forward(ctx, &scratch.context, rows, &mut scratch.proj);
        ops::add_assign(x, &scratch.proj);
        if !self.opts.pre_norm {
            block.norm.forward(x);
        }
    }
}

fn optional_norm(w: &WeightReader, scope: &str, d: usize, eps: Option<f32>) -> Result<Option<Norm>> {
    if w.contains(&format!("{scope}/gamma")) {
        Norm::load(w, scope, d, eps).map(Some)
    } else {
        Ok(None)
    }
}

/// Encoder states of a batch: sequence `i` occupies rows `offsets[i] .. offsets[i] + lengths[i]`.
pub struct EncoderOutput {
    pub data: Vec<f32>,
    pub offsets: Vec<usize>,
    pub lengths: Vec<usize>,
    pub dim: usize,
}

/// The output layer of one batch restricted to a vocabulary subset (a shortlist).
struct OutputSubset {
    ids: Vec<u32>,
    projection: Linear,
}

/// What the decoder carries between steps for the rows (hypotheses) being decoded.
pub struct DecoderState {
    /// For each row, the batch example whose encoder output it attends to.
    row_example: Vec<usize>,
    /// SSRU cell states or running averages per layer: [rows, d] (empty for attention layers).
    cells: Vec<Vec<f32>>,
    output: Option<OutputSubset>,
    /// Cached self-attention keys and values: [layer][row] -> [steps, d].
    self_keys: Vec<Vec<Vec<f32>>>,
    self_values: Vec<Vec<Vec<f32>>>,
    /// Cross-attention keys and values per layer, computed once: [source rows, 2d].
    memory_kv: Vec<Vec<f32>>,
    memory_offsets: Vec<usize>,
    memory_lengths: Vec<usize>,
    step: usize,
    scratch: Scratch,
    x: Vec<f32>,
}

impl DecoderState {
    pub fn num_rows(&self) -> usize {
        self.row_example.len()
    }

    pub fn step(&self) -> usize {
        self.step
    }

    /// Whether some example has several rows (beams), i.e. fewer live examples than rows.
    pub fn rows_share_examples(&self) -> bool {
        self.row_example.windows(2).any(|w| w[0] == w[1])
    }

    /// Keeps rows `sources[i]` as the new row `i` (beam reordering, finished rows removed).
    /// A source row used once is moved, not copied.
    pub fn select_rows(&mut self, sources: &[usize]) {
        let mut uses = vec![0usize; self.row_example.len()];
        sources.iter().for_each(|&s| uses[s] += 1);
        let reorder = |rows: &mut Vec<Vec<f32>>, uses: &mut [usize]| {
            let mut old = std::mem::take(rows);
            // The buffers of rows nobody continues are refilled with the copies, which
            // spares an allocation (and its fresh, zeroed pages) per copied row.
            let mut spare: Vec<Vec<f32>> =
                old.iter_mut().zip(uses.iter()).filter(|(_, &u)| u == 0).map(|(v, _)| std::mem::take(v)).collect();
            *rows = sources
                .iter()
                .map(|&s| {
                    uses[s] -= 1;
                    if uses[s] == 0 {
                        std::mem::take(&mut old[s])
                    } else {
                        let mut copy = spare.pop().unwrap_or_default();
                        copy.clear();
                        // Room for a few coming steps, so the next append does not copy the
                        // whole history a second time. Sized from the length, never from a
                        // capacity: capacities passed from row to row would compound.
                        copy.reserve_exact(old[s].len() * 5 / 4 + 64);
                        copy.extend_from_slice(&old[s]);
                        copy
                    }
                })
                .collect();
        };
        for l in 0..self.self_keys.len() {
            let mut u = uses.clone();
            reorder(&mut self.self_keys[l], &mut u);
            let mut u = uses.clone();
            reorder(&mut self.self_values[l], &mut u);
        }
        for cells in self.cells.iter_mut().filter(|c| !c.is_empty()) {
            let d = cells.len() / self.row_example.len();
            *cells = sources.iter().flat_map(|&s| cells[s * d..(s + 1) * d].iter().copied()).collect();
        }
        self.row_example = sources.iter().map(|&s| self.row_example[s]).collect();
    }
}

impl Decoder {
    pub fn load(w: &WeightReader, eps: Option<f32>) -> Result<Decoder> {
        let scope = "decoder";
        let embeddings = EmbeddingTable::load(w, "decoder/embeddings/weight", PROJECTION)?;
        let d = embeddings.dim();
        let opts = read_stack_options(w, scope, d)?;
        let activation = read_activation(w, scope)?;
        let n = count_layers(w, scope);
        if n == 0 {
            return Err(Error::invalid_model("model.bin: the decoder has no layers"));
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
        // The alignment attributes only matter for returning attention, which Tolk does not.
        w.scalar("decoder/alignment_layer")?;
        w.scalar("decoder/alignment_heads")?;
        Ok(Decoder {
            scale: embeddings_scale(w, scope, d)?,
            zero_start_embedding: w.flag("decoder/start_from_zero_embedding", false)?,
            positions: Positions::load(w, scope, d)?,
            layernorm_embedding: optional_norm(w, "decoder/layernorm_embedding", d, eps)?,
            final_norm: optional_norm(w, "decoder/layer_norm", d, eps)?,
            embeddings,
            layers,
            projection,
            opts,
        })
    }

    pub fn vocabulary_size(&self) -> usize {
        self.projection.out_dim()
    }

    pub fn embeddings_size(&self) -> usize {
        self.embeddings.rows()
    }

    pub fn max_positions(&self) -> Option<usize> {
        self.positions.max_positions()
    }

    /// Prepares the state for one row per batch example; cross-attention keys/values are
    /// projected once here for every layer. With `output_ids` (sorted target ids), the
    /// output layer of this batch is restricted to them.
    pub fn initial_state(&self, ctx: &Ctx, memory: &EncoderOutput, output_ids: Option<Vec<u32>>) -> Result<DecoderState> {
        let vocabulary = self.vocabulary_size();
        let output = match output_ids {
            Some(ids) => {
                if ids.is_empty() || ids.windows(2).any(|w| w[0] >= w[1]) || ids.last().is_some_and(|&i| i as usize >= vocabulary) {
                    return Err(Error::invalid_argument(format!(
                        "an output vocabulary subset must be sorted, unique, non-empty ids below {vocabulary}"
                    )));
                }
                let projection = self.projection.select_rows(&ids);
                Some(OutputSubset { ids, projection })
            }
            None => None,
        };
        let total: usize = memory.lengths.iter().sum();
        let memory_kv = self
            .layers
            .iter()
            .map(|layer| {
                let mut kv = Vec::new();
                layer.cross_attention.kv.forward(ctx, &memory.data, total, &mut kv);
                kv
            })
            .collect();
        let rows = memory.lengths.len();
        let d = self.embeddings.dim();
        let cells = self
            .layers
            .iter()
            .map(|l| match l.self_attention {
                DecoderSelfAttention::Ssru(_) | DecoderSelfAttention::Average(_) => vec![0.0; rows * d],
                DecoderSelfAttention::Attention(_) => Vec::new(),
            })
            .collect();
        Ok(DecoderState {
            row_example: (0..rows).collect(),
            cells,
            output,
            self_keys: vec![vec![Vec::new(); rows]; self.layers.len()],
            self_values: vec![vec![Vec::new(); rows]; self.layers.len()],
            memory_kv,
            memory_offsets: memory.offsets.clone(),
            memory_lengths: memory.lengths.clone(),
            step: 0,
            scratch: Scratch::default(),
            x: Vec::new(),
        })
    }

    /// Runs one decoding step for every row of `state` with input `ids` (one per row) and
    /// writes the logits [rows, vocabulary] into `logits`.
    pub fn step(&self, ctx: &Ctx, ids: &[u32], state: &mut DecoderState, logits: &mut Vec<f32>) {
        let d = self.embeddings.dim();
        let rows = ids.len();
        debug_assert_eq!(rows, state.num_rows());
        let step = state.step;
        let mut x = std::mem::take(&mut state.x);
        x.clear();
        x.resize(rows * d, 0.0);
        for (r, &id) in ids.iter().enumerate() {
            let row = &mut x[r * d..(r + 1) * d];
            if self.zero_start_embedding && step == 0 {
                // Marian starts decoding from a zero vector instead of the <s> embedding.
                row.fill(0.0);
            } else {
                self.embeddings.lookup(id as usize, self.scale, row);
            }
            self.positions.add(step, row);
        }
        if let Some(norm) = &self.layernorm_embedding {
            norm.forward(&mut x);
        }
        let mut scratch = std::mem::take(&mut state.scratch);
        for (l, layer) in self.layers.iter().enumerate() {
            match &layer.self_attention {
                DecoderSelfAttention::Attention(block) => self.self_attention_step(ctx, l, block, &mut x, state, &mut scratch),
                DecoderSelfAttention::Ssru(block) => self.ssru_step(ctx, block, &mut x, &mut state.cells[l], &mut scratch),
                DecoderSelfAttention::Average(block) => {
                    self.average_attention_step(ctx, block, &mut x, &mut state.cells[l], step, &mut scratch)
                }
            }
            self.cross_attention_step(ctx, l, &layer.cross_attention, &mut x, state, &mut scratch);
            layer.ffn.forward(ctx, &mut x, rows, self.opts.pre_norm, &mut scratch);
        }
        if let Some(norm) = &self.final_norm {
            norm.forward(&mut x);
        }
        let projection = state.output.as_ref().map_or(&self.projection, |o| &o.projection);
        projection.forward(ctx, &x, rows, logits);
        state.scratch = scratch;
        state.x = x;
        state.step += 1;
    }

    fn normed_input<'a>(&self, norm: &Norm, x: &'a [f32], buf: &'a mut Vec<f32>) -> &'a [f32] {
        if self.opts.pre_norm {
            buf.clear();
            buf.extend_from_slice(x);
            norm.forward(buf);
            buf
        } else {
            x
        }
    }

    fn finish_block(&self, norm: &Norm, x: &mut [f32], proj: &[f32]) {
        ops::add_assign(x, proj);
        if !self.opts.pre_norm {
            norm.forward(x);
        }
    }

    fn self_attention_step(
        &self,
        ctx: &Ctx,
        layer: usize,
        block: &SelfAttention,
        x: &mut [f32],
        state: &mut DecoderState,
        scratch: &mut Scratch,
    ) {
        let d = self.embeddings.dim();
        let rows = state.num_rows();
        let (heads, head_dim) = (self.opts.num_heads, d / self.opts.num_heads);
        let scale = 1.0 / (head_dim as f32).sqrt();
        let mut normed = std::mem::take(&mut scratch.normed);
        let input = self.normed_input(&block.norm, x, &mut normed);
        let mut qkv = std::mem::take(&mut scratch.hidden);
        block.qkv.forward(ctx, input, rows, &mut qkv);
        scratch.context.clear();
        scratch.context.resize(rows * d, 0.0);
        for r in 0..rows {
            let row = &qkv[r * 3 * d..(r + 1) * 3 * d];
            let keys = &mut state.self_keys[layer][r];
            keys.extend_from_slice(&row[d..2 * d]);
            let values = &mut state.self_values[layer][r];
            values.extend_from_slice(&row[2 * d..]);
            let len = keys.len() / d;
            let kv = |data| KvView { data, stride: d, offset: 0 };
            let out = &mut scratch.context[r * d..(r + 1) * d];
            if self.opts.float_order == FloatOrder::Marian {
                // One query row per product: no peeled keys.
                attend_row_sequential(&row[..d], kv(keys), kv(values), len, usize::MAX, heads, head_dim, scale, &mut scratch.scores, out);
                continue;
            }
            attend_row(
                &row[..d],
                kv(keys),
                kv(values),
                len,
                heads,
                head_dim,
                scale,
                true,
                &mut scratch.scores,
                out,
            );
        }
        scratch.hidden = qkv;
        scratch.normed = normed;
        block.out.forward(ctx, &scratch.context, rows, &mut scratch.proj);
        self.finish_block(&block.norm, x, &scratch.proj);
    }

    /// `c = f * c + (1 - f) * (W x)` with `f = sigmoid(Wf x + bf)`, output `relu(c)`, then
    /// the residual and norm like any sub-layer.
    fn ssru_step(&self, ctx: &Ctx, block: &Ssru, x: &mut [f32], cells: &mut [f32], scratch: &mut Scratch) {
        let rows = cells.len() / self.embeddings.dim().max(1);
        let mut normed = std::mem::take(&mut scratch.normed);
        let input = self.normed_input(&block.norm, x, &mut normed);
        block.input.forward(ctx, input, rows, &mut scratch.hidden);
        block.forget.forward(ctx, input, rows, &mut scratch.query);
        ops::ssru_update(cells, &scratch.hidden, &scratch.query, &mut scratch.proj);
        scratch.normed = normed;
        self.finish_block(&block.norm, x, &scratch.proj);
    }

    /// `g = (g * t + x) / (t + 1)` (the average of the inputs so far), `y = FFN(g)`, gated
    /// `y = sigmoid(Wi x + bi) * x + sigmoid(Wf y + bf) * y`, then residual and norm.
    fn average_attention_step(
        &self,
        ctx: &Ctx,
        block: &AverageAttention,
        x: &mut [f32],
        average: &mut [f32],
        step: usize,
        scratch: &mut Scratch,
    ) {
        let rows = average.len() / self.embeddings.dim().max(1);
        let t = step as f32;
        for (g, &v) in average.iter_mut().zip(x.iter()) {
            *g = if step == 0 { v } else { (*g * t + v) / (t + 1.0) };
        }
        let mut y = std::mem::take(&mut scratch.normed);
        y.clear();
        y.extend_from_slice(average);
        if self.opts.pre_norm {
            block.norm.forward(&mut y);
        }
        for layer in &block.hidden {
            layer.forward(ctx, &y, rows, &mut scratch.hidden);
            block.activation.apply(&mut scratch.hidden);
            std::mem::swap(&mut y, &mut scratch.hidden);
        }
        if let Some(projection) = &block.projection {
            projection.forward(ctx, &y, rows, &mut scratch.hidden);
            std::mem::swap(&mut y, &mut scratch.hidden);
        }
        if let Some((input_gate, forget_gate)) = &block.gate {
            input_gate.forward(ctx, x, rows, &mut scratch.query);
            forget_gate.forward(ctx, &y, rows, &mut scratch.context);
            for (((v, &xi), &gi), &gf) in y.iter_mut().zip(x.iter()).zip(&scratch.query).zip(&scratch.context) {
                let (gi, gf) = (1.0 / (1.0 + (-gi).exp()), 1.0 / (1.0 + (-gf).exp()));
                *v = gi * xi + gf * *v;
            }
        }
        scratch.proj.clear();
        scratch.proj.extend_from_slice(&y);
        scratch.normed = y;
        self.finish_block(&block.norm, x, &scratch.proj);
    }

    fn cross_attention_step(
        &self,
        ctx: &Ctx,
        layer: usize,
        block: &CrossAttention,
        x: &mut [f32],
        state: &mut DecoderState,
        scratch: &mut Scratch,
    ) {
        let d = self.embeddings.dim();
        let rows = state.num_rows();
        let (heads, head_dim) = (self.opts.num_heads, d / self.opts.num_heads);
        let scale = 1.0 / (head_dim as f32).sqrt();
        let mut normed = std::mem::take(&mut scratch.normed);
        let input = self.normed_input(&block.norm, x, &mut normed);
        let mut query = std::mem::take(&mut scratch.query);
        block.query.forward(ctx, input, rows, &mut query);
        scratch.context.clear();
        scratch.context.resize(rows * d, 0.0);
        let kv = &state.memory_kv[layer];
        // CTranslate2 pads the batch's sources to the longest one, which decides MKL's order.
        let padded = state.memory_lengths.iter().copied().max().unwrap_or(0);
        // CTranslate2 keeps the memory keys/values once per example, not per beam: with
        // several rows per example (beam search after the first step), the example's beams
        // are the query rows of one product (`beam_size > 1` in its cross-attention), which
        // MKL sums in its several-rows order instead of the one-query-row order.
        let single_query = !state.rows_share_examples();
        for r in 0..rows {
            let ex = state.row_example[r];
            let (off, len) = (state.memory_offsets[ex], state.memory_lengths[ex]);
            let mem = &kv[off * 2 * d..(off + len) * 2 * d];
            let (keys, values) = (KvView { data: mem, stride: 2 * d, offset: 0 }, KvView { data: mem, stride: 2 * d, offset: d });
            let q = &query[r * d..(r + 1) * d];
            if self.opts.float_order == FloatOrder::Marian {
                // One query row per product (Marian keeps the beams apart): no peeled keys.
                let out = &mut scratch.context[r * d..(r + 1) * d];
                attend_row_sequential(q, keys, values, len, usize::MAX, heads, head_dim, scale, &mut scratch.scores, out);
                continue;
            }
            attend_row_padded(
                q,
                keys,
                values,
                len,
                padded,
                heads,
                head_dim,
                scale,
                single_query,
                &mut scratch.scores,
                &mut scratch.context[r * d..(r + 1) * d],
            );
        }
        scratch.query = query;
        scratch.normed = normed;
        block.out.forward(ctx, &scratch.context, rows, &mut scratch.proj);
        self.finish_block(&block.norm, x, &scratch.proj);
    }
}

/// A batch being decoded by a [`Decoder`].
pub struct TransformerSession<'a> {
    pub(crate) decoder: &'a Decoder,
    pub(crate) state: DecoderState,
}

impl DecoderSession for TransformerSession<'_> {
    fn vocabulary_size(&self) -> usize {
        self.state.output.as_ref().map_or(self.decoder.vocabulary_size(), |o| o.ids.len())
    }
    fn output_ids(&self) -> Option<&[u32]> {
        self.state.output.as_ref().map(|o| o.ids.as_slice())
    }
    fn step(&mut self, ctx: &Ctx, ids: &[u32], logits: &mut Vec<f32>) {
        self.decoder.step(ctx, ids, &mut self.state, logits)
    }
    fn select_rows(&mut self, rows: &[usize]) {
        self.state.select_rows(rows)
    }
}
