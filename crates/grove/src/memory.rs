//! Memory that follows `grove serve`'s in-flight budget. glibc's malloc
//! raises its mmap threshold each time a large block is freed (up to 32
//! MiB), after which 1 MiB request buffers come from the heaps of the
//! threads that touch them, fragment there, and stay: with a 256 MiB
//! budget the server peaked at 346 MiB over its start and held 135 MiB
//! once idle. Fixing the threshold keeps every large buffer in its own
//! mapping, returned to the system when freed; trimming once idle gives
//! back what small allocations left in the heaps.
//!
//! The only unsafe code of the binary: two calls into the C library, with
//! integer arguments, which touch no Rust memory. Elsewhere than glibc
//! they are left out and the allocator behaves as it does. No well-kept
//! crate offers these two calls without unsafe code of its own (libc's are
//! as unsafe as these declarations), and replacing the allocator would
//! change far more than a threshold.
#![allow(unsafe_code)]

/// Allocations from this size on are mappings of their own: one request
/// buffer is at least a block (4 KiB) and mostly 64 KiB to 32 MiB.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD_BYTES: i32 = 128 * 1024;

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod glibc {
    /// mallopt's parameter for the mmap threshold (malloc.h).
    pub const M_MMAP_THRESHOLD: i32 = -3;

    extern "C" {
        pub fn mallopt(param: i32, value: i32) -> i32;
        pub fn malloc_trim(pad: usize) -> i32;
    }
}

/// Makes every allocation of [`MMAP_THRESHOLD_BYTES`] or more a mapping
/// of its own, for good (the threshold no longer moves).
pub fn keep_large_buffers_apart() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt takes two integers and changes malloc's settings,
        // which glibc allows at any time from any thread.
        let done = unsafe { glibc::mallopt(glibc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) };
        if done != 1 {
            tracing::warn!("cannot fix malloc's mmap threshold; idle memory may stay held");
        }
    }
}

/// Gives the free memory at the top and in the middle of malloc's heaps
/// back to the system (the server calls it once each time it goes idle).
pub fn give_back_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim takes an integer and only releases pages
        // malloc holds free; no memory in use is touched.
        let _released = unsafe { glibc::malloc_trim(0) };
    }
}
