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
//! glibc caps the mmap threshold at 32 MiB, and batch-32 activations of the
//! keras.applications models pass it (ResNet50's 32x32x256 at 128x128 inputs is 33.5 MB,
//! MobileNetV2's 64x64x96 50 MB): each such buffer was mapped, faulted in and unmapped
//! again on every call, 25,000 page faults per ResNet50 `predict` at batch 32 (580 ->
//! 551 ms of one thread's CPU without them; MobileNetV2 12,700 faults, 162 -> 149 ms).
//! So `mmap` is switched off for allocations altogether (`M_MMAP_MAX` 0): every block
//! comes from the heap, and free memory beyond 256 MiB at the top of the heap is still
//! returned. The peak resident memory of those runs fell (ResNet50 399 -> 383 MiB,
//! MobileNetV2 251 -> 229), since a freed block is reused rather than mapped anew. glibc
//! still maps a block too large for a thread's heap (64 MiB) there.
//!
//! The setting is process-wide, so it is applied once, when the extension loads, only on
//! glibc, only where the user has not chosen the thresholds themselves
//! (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`, `MALLOC_MMAP_MAX_`).

/// Applies the thresholds above (see the module comment); returns whether it did.
pub fn tune_malloc() -> bool {
    let user_set = |v: &str| std::env::var_os(v).is_some();
    if user_set("MALLOC_MMAP_THRESHOLD_")
        || user_set("MALLOC_TRIM_THRESHOLD_")
        || user_set("MALLOC_MMAP_MAX_")
    {
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
            && libc::mallopt(libc::M_MMAP_MAX, 0) == 1
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_thresholds() -> bool {
    false
}
