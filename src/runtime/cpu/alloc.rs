//! Keeping the kernels' result buffers out of the page-fault path.
//!
//! Every kernel writes a fresh buffer; a training step of the Keras CNN allocates and
//! frees a few hundred MiB in buffers of 1-10 MiB. glibc's malloc serves such sizes with
//! `mmap` (or returns them to the system with `trim`) once they pass its dynamic
//! thresholds, so each step page-faulted its buffers in again and unmapped them after:
//! perf put a quarter of the CNN step in the kernel's fault, TLB-shootdown and page-clearing
//! paths. Raising the two thresholds keeps freed buffers in the heap for the next call
//! (measured: CNN 991 -> 1,678 samples/s, MLP 19.1k -> 29.1k, LSTM unchanged).
//!
//! The setting is process-wide, so it is applied once, when the extension loads, only on
//! glibc, only where the user has not chosen the thresholds themselves
//! (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`). Blocks of 32 MiB and more are still mapped and unmapped
//! (glibc's ceiling for the threshold), and free memory beyond 256 MiB at the top of the
//! heap is still returned, so peak resident memory is unchanged.

/// Applies the thresholds above (see the module comment); returns whether it did.
pub fn tune_malloc() -> bool {
    let user_set = |v: &str| std::env::var_os(v).is_some();
    if user_set("MALLOC_MMAP_THRESHOLD_") || user_set("MALLOC_TRIM_THRESHOLD_") {
        return false;
    }
    set_thresholds()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_thresholds() -> bool {
    const MMAP_THRESHOLD: libc::c_int = 32 << 20;
    const TRIM_THRESHOLD: libc::c_int = 256 << 20;
    // SAFETY: mallopt only changes glibc's allocation policy; it is thread-safe and
    // leaves existing allocations valid.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_thresholds() -> bool {
    false
}
