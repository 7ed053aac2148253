//! Weight buffers backed by transparent huge pages where the kernel allows it.
//!
//! Decoding streams every packed weight from memory once a step (tens of MB, more than
//! the L3 holds). In 4 KiB pages that is a TLB miss and a fresh start of the hardware
//! prefetcher's stream every 4 KiB; in 2 MiB pages neither.

/// `len` copies of `fill`, the buffer's whole 2 MiB pages asked for as huge pages before
/// the first touch (`MADV_HUGEPAGE`; many systems give them only when asked). Elsewhere,
/// or if the kernel declines, it is an ordinary `Vec`.
fn filled_buffer<T: Copy>(len: usize, fill: T) -> Vec<T> {
    let mut data: Vec<T> = Vec::with_capacity(len);
    #[cfg(target_os = "linux")]
    advise_huge_pages(data.as_ptr() as *const u8, len * std::mem::size_of::<T>());
    data.resize(len, fill);
    data
}

/// A [`filled_buffer`] with room for `len` values starting 64-byte aligned (so that no
/// vector load of a packed panel straddles a cache line): the buffer and where the
/// aligned values start.
pub fn aligned_buffer<T: Copy>(len: usize, fill: T) -> (Vec<T>, usize) {
    let pad = (64 / std::mem::size_of::<T>()).max(1);
    let data = filled_buffer(len + pad, fill);
    // `align_offset` may answer "unknown" (usize::MAX); any start within the pad then serves.
    let start = data.as_ptr().align_offset(64).min(pad - 1);
    (data, start)
}

#[cfg(target_os = "linux")]
fn advise_huge_pages(ptr: *const u8, len: usize) {
    const HUGE: usize = 2 << 20;
    let (begin, end) = ((ptr as usize).next_multiple_of(HUGE), (ptr as usize + len) / HUGE * HUGE);
    if end > begin {
        // SAFETY: [begin, end) lies inside this Vec's allocation; the advice changes how
        // the kernel backs the pages, never their contents. A failure only leaves them 4 KiB.
        unsafe {
            libc::madvise(begin as *mut libc::c_void, end - begin, libc::MADV_HUGEPAGE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filled_buffers_hold_their_values_across_huge_page_boundaries() {
        for len in [0, 1, 4095, (2 << 20) - 1, 2 << 20, (5 << 20) + 3] {
            let bytes = filled_buffer(len, 0x80u8);
            assert_eq!(bytes.len(), len);
            assert!(bytes.iter().all(|&b| b == 0x80));
            let floats = filled_buffer(len / 4, -1.5f32);
            assert_eq!(floats.len(), len / 4);
            assert!(floats.iter().all(|&v| v == -1.5));
        }
    }

    #[test]
    fn aligned_buffers_start_on_a_cache_line_with_room_for_every_value() {
        for len in [0, 1, 63, 64, 1000, (2 << 20) + 5] {
            let (bytes, start) = aligned_buffer(len, 7u8);
            assert_eq!(bytes.as_ptr().wrapping_add(start) as usize % 64, 0);
            assert!(bytes[start..start + len].iter().all(|&b| b == 7));
            let (floats, start) = aligned_buffer(len, 0.5f32);
            assert_eq!(floats.as_ptr().wrapping_add(start) as usize % 64, 0);
            assert!(floats[start..start + len].iter().all(|&v| v == 0.5));
            let (halves, start) = aligned_buffer(len, -3i16);
            assert_eq!(halves.as_ptr().wrapping_add(start) as usize % 64, 0);
            assert!(halves[start..start + len].iter().all(|&v| v == -3));
        }
    }
}
