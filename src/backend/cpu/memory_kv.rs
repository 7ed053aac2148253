//! Cross-attention keys and values (the encoder output projected once per decoder layer),
//! one allocation per example. An example whose rows have all finished gives its memory
//! back at once and moves nobody else's: in one buffer per layer, continuous batching had
//! to compact the live examples' rows (a memmove of the whole state) and the buffer's
//! growth by `realloc` left holes in the heap that kept the process large.
//!
//! Each example's positions are pages of their own (an anonymous map), not heap memory:
//! freed, they go back to the system at once. In the heap, the examples of a call's
//! batches (40-320 KB each on zh-en) left holes between the live ones that the next
//! batch's did not fit: the process grew by 7 MB (500 verses, greedy), or it had to hand
//! the free pages back after each batch (`malloc_trim`) and fault them in again (5% of the
//! time under a decoding memory budget, which adds a batch in parts).
use std::sync::atomic::{AtomicUsize, Ordering};

use memmap2::{MmapMut, MmapOptions};

use super::kv_storage::KvCodec;
use crate::backend::KvCacheType;

/// Maps the process may hold for examples' positions (one per example and layer): the
/// system's limit on a process's maps (65530 by default on Linux) is shared with the host
/// application, so beyond this many the positions go to the heap.
const MAX_MAPS: usize = 8192;
static MAPS: AtomicUsize = AtomicUsize::new(0);

/// One example's stored positions.
enum Positions {
    /// Pages of its own; their first `len` floats.
    Mapped(MmapMut, usize),
    /// Where no pages could be mapped (and for no positions).
    Heap(Vec<f32>),
}

impl Positions {
    /// `len` floats, zeroed; pages are touched now, in one call, not one fault at a time.
    fn zeroed(len: usize) -> Positions {
        if len > 0 && MAPS.fetch_add(1, Ordering::Relaxed) < MAX_MAPS {
            if let Ok(map) = MmapOptions::new().len(len * std::mem::size_of::<f32>()).populate().map_anon() {
                return Positions::Mapped(map, len);
            }
        }
        if len > 0 {
            MAPS.fetch_sub(1, Ordering::Relaxed);
        }
        Positions::Heap(vec![0.0; len])
    }

    fn floats(&self) -> &[f32] {
        match self {
            // A map starts on a page: aligned for f32.
            Positions::Mapped(map, len) => &bytemuck::cast_slice(&map[..])[..*len],
            Positions::Heap(v) => v,
        }
    }

    fn floats_mut(&mut self) -> &mut [f32] {
        match self {
            Positions::Mapped(map, len) => &mut bytemuck::cast_slice_mut(&mut map[..])[..*len],
            Positions::Heap(v) => v,
        }
    }
}

impl Drop for Positions {
    fn drop(&mut self) {
        if let Positions::Mapped(..) = self {
            MAPS.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// The keys and values of one decoder layer, per example: `[len, slots]` floats each
/// (`[key | value]` positions, stored as the decoding's `KvCacheType` asks).
#[derive(Default)]
pub struct CpuMemoryKv {
    examples: Vec<Positions>,
    /// Floats a stored position takes, known from the first append.
    slots: usize,
}

impl CpuMemoryKv {
    /// The float32 memory of examples of `lengths` whose positions are `rows` (`[Σ lengths,
    /// width]`).
    pub fn float32(rows: &[f32], lengths: &[usize], width: usize) -> CpuMemoryKv {
        let mut memory = CpuMemoryKv::default();
        memory.append(rows, lengths, width, KvCodec::new(KvCacheType::Float32, width));
        memory
    }

    /// Appends the examples of `lengths`, whose projected positions are the `[Σ lengths,
    /// width]` float32 `rows`, stored as `codec` says.
    pub fn append(&mut self, rows: &[f32], lengths: &[usize], width: usize, codec: KvCodec) {
        let slots = codec.slots(width);
        debug_assert!(self.examples.is_empty() || self.slots == slots, "one layer's memory is stored one way");
        debug_assert_eq!(rows.len(), lengths.iter().sum::<usize>() * width);
        self.slots = slots;
        let mut at = 0;
        for &len in lengths {
            let positions = &rows[at * width..(at + len) * width];
            at += len;
            let mut stored = Positions::zeroed(len * slots);
            let out = stored.floats_mut();
            if codec.kv == KvCacheType::Float32 {
                out.copy_from_slice(positions);
            } else {
                for (row, out) in positions.chunks_exact(width).zip(out.chunks_exact_mut(slots)) {
                    codec.encode(row, out);
                }
            }
            self.examples.push(stored);
        }
    }

    /// Keeps examples `kept` (in that order) and frees the others'.
    pub fn keep(&mut self, kept: &[usize]) {
        let mut old: Vec<Option<Positions>> = std::mem::take(&mut self.examples).into_iter().map(Some).collect();
        self.examples = kept.iter().map(|&e| old[e].take().expect("examples are kept once")).collect();
    }

    pub fn num_examples(&self) -> usize {
        self.examples.len()
    }

    /// Example `e`'s stored positions: `[len, slots]`.
    pub fn example(&self, e: usize) -> &[f32] {
        self.examples[e].floats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn examples_keep_their_positions_through_appends_and_drops() {
        let width = 4;
        let codec = KvCodec::new(KvCacheType::Float32, 2);
        let rows = |first: usize, n: usize| (first * width..(first + n) * width).map(|v| v as f32).collect::<Vec<f32>>();
        let mut memory = CpuMemoryKv::default();
        memory.append(&rows(0, 5), &[2, 3], width, codec);
        memory.append(&rows(5, 1), &[1], width, codec);
        assert_eq!(memory.num_examples(), 3);
        assert_eq!(memory.example(1), &rows(2, 3)[..]);
        memory.keep(&[0, 2]);
        assert_eq!(memory.num_examples(), 2);
        assert_eq!(memory.example(0), &rows(0, 2)[..]);
        assert_eq!(memory.example(1), &rows(5, 1)[..]);
        memory.keep(&[]);
        assert_eq!(memory.num_examples(), 0);
    }

    #[test]
    fn compact_examples_hold_their_encoded_positions() {
        let (width, head_dim) = (16, 4);
        for kv in [KvCacheType::BFloat16, KvCacheType::Int8] {
            let codec = KvCodec::new(kv, head_dim);
            let rows: Vec<f32> = (0..3 * width).map(|v| (v as f32).sin() * 3.0).collect();
            let mut memory = CpuMemoryKv::default();
            memory.append(&rows, &[1, 2], width, codec);
            let mut expected = vec![0.0; codec.slots(width)];
            codec.encode(&rows[width..2 * width], &mut expected);
            assert_eq!(memory.example(1).len(), 2 * codec.slots(width), "{kv:?}");
            assert_eq!(&memory.example(1)[..codec.slots(width)], &expected[..], "{kv:?}");
        }
    }
}
