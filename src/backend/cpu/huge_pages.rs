//! Weight buffers backed by transparent huge pages where the kernel allows it.
//!
//! Decoding streams every packed weight from memory once a step (tens of MB, more than
//! L2 holds). In 4 KiB pages that is a TLB miss and a fresh start of the hardware
//! prefetcher's stream every 4 KiB; in 2 MiB pages neither. Most of a model's matrices are
//! smaller than a huge page (a 512 x 512 int8 layer is 256 KiB), so while a model loads
//! (`for_model_weights`) its matrices are placed side by side in shared chunks of whole
//! huge pages. Each matrix used to have an allocation of its own, in which only the 2 MiB
//! pages wholly inside it could be huge: 30 of the 83 MB of the zh-en int8 model's weights
//! were (the 65k output layer), and every encoder and decoder layer was in 4 KiB pages;
//! shared chunks put 75 MB in huge pages, at the same resident size. On a Xeon with AMX
//! (2026-12-07, alternating runs of 250 verses, bench/RESULTS.md), the first row group's
//! pass over a layer's panels, which reads them from memory, took 40% less time, and int8
//! greedy decoding ran 2-7% faster at AVX2 (five pairs out of five) and 2-7% natively
//! (three of three), float32 greedy 2% faster; beam 4, more compute-bound, within the noise.
//!
//! A chunk lives as long as any buffer in it, and its pages are resident once touched; a
//! model loaded while another's last chunk has room fills it on, and that chunk then stays
//! until both are dropped (at most one chunk per model, 32 MiB).
//! Buffers made outside `for_model_weights` (a shortlist's gathered rows, once a batch, and
//! tests) get allocations of their own, so that nothing short-lived pins a chunk.

use std::alloc::{self, Layout};
use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};

const HUGE_PAGE: usize = 2 << 20;
/// The size of a chunk that a model's matrices share.
const CHUNK: usize = 32 << 20;
/// Larger matrices get a chunk of their own (whole huge pages too), so that chunks are
/// not left mostly empty.
const SHARED_MAX: usize = CHUNK / 4;
/// Where each buffer starts: a cache line, so that no vector load of a packed panel
/// straddles two.
const ALIGN: usize = 64;

thread_local! {
    /// Whether this thread is loading a model's weights (`for_model_weights`).
    static SHARING: Cell<bool> = const { Cell::new(false) };
}

/// The chunk being filled: the next free byte of the last chunk made, while it lives.
static ARENA: Mutex<(Weak<Chunk>, usize)> = Mutex::new((Weak::new(), 0));

/// Runs `f` (the packing of a model's matrices) with the buffers it makes placed in
/// chunks shared with the model's other matrices.
pub fn for_model_weights<R>(f: impl FnOnce() -> R) -> R {
    crate::scoped::with_local(&SHARING, true, f)
}

/// One allocation that buffers are carved from.
struct Chunk {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: a chunk is plain memory; each buffer in it owns a disjoint region (see Buffer).
unsafe impl Send for Chunk {}
unsafe impl Sync for Chunk {}

impl Chunk {
    /// `bytes` (> 0) of memory: in whole huge pages, aligned to one and advised to be
    /// backed by them, from one huge page up; cache-line aligned below.
    fn new(bytes: usize) -> Chunk {
        let huge = bytes >= HUGE_PAGE;
        let (size, align) = if huge { (bytes.next_multiple_of(HUGE_PAGE), HUGE_PAGE) } else { (bytes, ALIGN) };
        let layout = Layout::from_size_align(size, align).expect("weight buffer too large");
        // SAFETY: the layout's size is non-zero.
        let ptr = NonNull::new(unsafe { alloc::alloc(layout) }).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        #[cfg(target_os = "linux")]
        if huge {
            // SAFETY: the range is this allocation; the advice changes how the kernel backs
            // the pages, never their contents. A failure only leaves them 4 KiB.
            unsafe {
                libc::madvise(ptr.as_ptr() as *mut libc::c_void, size, libc::MADV_HUGEPAGE);
            }
        }
        Chunk { ptr, layout }
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: allocated in Chunk::new with this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// A region of `bytes` in the shared chunk being filled, or in a new one.
fn shared_region(bytes: usize) -> (Arc<Chunk>, usize) {
    let mut arena = ARENA.lock().unwrap_or_else(|e| e.into_inner());
    let at = arena.1.next_multiple_of(ALIGN);
    if let Some(chunk) = arena.0.upgrade() {
        if at + bytes <= chunk.layout.size() {
            arena.1 = at + bytes;
            return (chunk, at);
        }
    }
    let chunk = Arc::new(Chunk::new(CHUNK));
    *arena = (Arc::downgrade(&chunk), bytes);
    (chunk, 0)
}

/// `len` values of `T`, starting 64-byte aligned, in a chunk (see the module doc).
pub struct Buffer<T> {
    _chunk: Option<Arc<Chunk>>,
    ptr: NonNull<T>,
    len: usize,
}

// SAFETY: a buffer owns its values (no other buffer's region overlaps them; the chunk only
// keeps the memory alive), as a Vec<T> does.
unsafe impl<T: Send> Send for Buffer<T> {}
unsafe impl<T: Sync> Sync for Buffer<T> {}

impl<T: Copy> Buffer<T> {
    /// `len` copies of `fill`.
    pub fn filled(len: usize, fill: T) -> Buffer<T> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).expect("weight buffer too large");
        if bytes == 0 {
            return Buffer { _chunk: None, ptr: NonNull::dangling(), len };
        }
        const { assert!(std::mem::align_of::<T>() <= ALIGN) };
        let (chunk, at) = match SHARING.with(Cell::get) && bytes <= SHARED_MAX {
            true => shared_region(bytes),
            false => (Arc::new(Chunk::new(bytes)), 0),
        };
        // SAFETY: [at, at + bytes) is inside the chunk and given to no other buffer; `at` is
        // 64-byte aligned, enough for T. Every value is written before the buffer is used.
        let ptr = unsafe {
            let ptr = chunk.ptr.as_ptr().add(at) as *mut T;
            for i in 0..len {
                ptr.add(i).write(fill);
            }
            NonNull::new_unchecked(ptr)
        };
        Buffer { _chunk: Some(chunk), ptr, len }
    }
}

impl<T> std::ops::Deref for Buffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `len` initialized values at `ptr` (or none, dangling), owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> std::ops::DerefMut for Buffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in deref, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check<T: Copy + PartialEq + std::fmt::Debug>(len: usize, fill: T) -> Buffer<T> {
        let b = Buffer::filled(len, fill);
        assert_eq!(b.len(), len);
        assert!(len == 0 || (b.as_ptr() as usize).is_multiple_of(ALIGN), "{len} values start on a cache line");
        assert!(b.iter().all(|&v| v == fill));
        b
    }

    #[test]
    fn buffers_hold_their_values_on_a_cache_line_across_huge_page_boundaries() {
        for len in [0, 1, 63, 64, 1000, 4095, (2 << 20) - 1, 2 << 20, (5 << 20) + 3] {
            check(len, 0x80u8);
            check(len / 4, -1.5f32);
            check(len / 2, -3i16);
        }
    }

    /// A model's matrices share chunks, each region its own: writing one leaves the others'
    /// values; a matrix past `SHARED_MAX` and buffers made outside the scope get their own.
    #[test]
    fn model_weights_share_chunks_without_overlapping() {
        let mut shared: Vec<Buffer<u8>> = for_model_weights(|| (0..40).map(|i| check(100_000 + 4099 * i, i as u8)).collect());
        assert!(!SHARING.with(Cell::get), "the scope ends with its call");
        let chunk = |b: &Buffer<u8>| Arc::as_ptr(b._chunk.as_ref().unwrap());
        assert!(shared.windows(2).filter(|w| chunk(&w[0]) == chunk(&w[1])).count() >= 30);
        for (i, b) in shared.iter_mut().enumerate() {
            b.fill(200 + i as u8 % 50);
        }
        for (i, b) in shared.iter().enumerate() {
            assert!(b.iter().all(|&v| v == 200 + i as u8 % 50));
        }
        let own = check(1000, 1u8);
        assert!(shared.iter().all(|b| chunk(b) != chunk(&own)));
        let large = for_model_weights(|| check(SHARED_MAX + 1, 2u8));
        assert!(shared.iter().all(|b| chunk(b) != chunk(&large)));
        assert!((large.as_ptr() as usize).is_multiple_of(HUGE_PAGE), "a chunk of its own starts on a huge page");
    }

    #[test]
    fn the_scope_ends_after_a_panic() {
        let result = std::panic::catch_unwind(|| for_model_weights(|| panic!("a loader's panic")));
        assert!(result.is_err());
        assert!(!SHARING.with(Cell::get));
    }
}
