//! Weight buffers backed by transparent huge pages where the kernel allows it.
//!
//! Decoding streams every packed weight from memory once a step (tens of MB, more than
//! the L3 holds). In 4 KiB pages that is a TLB miss and a fresh start of the hardware
//! prefetcher's stream every 4 KiB; in 2 MiB pages neither.

/// `len` copies of `fill`, the buffer's whole 2 MiB pages asked for as huge pages before
/// the first touch (`MADV_HUGEPAGE`; many systems give them only when asked). Elsewhere,
/// or if the kernel declines, it is an ordinary `Vec`.
pub fn filled_buffer<T: Copy>(len: usize, fill: T) -> Vec<T> {
    let mut data: Vec<T> = Vec::with_capacity(len);
    #[cfg(target_os = "linux")]
    advise_huge_pages(data.as_ptr() as *const u8, len * std::mem::size_of::<T>());
    data.resize(len, fill);
    data
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
}
