//! Keeping the kernels' result buffers out of the page-fault path.
//!
//! Every kernel writes a fresh buffer: a training step of the Keras CNN allocates and
//! frees a few hundred MiB in buffers of 1-10 MiB, and the batch-32 activations of the
//! keras.applications models are 30-50 MiB each (ResNet50's 32x32x256 at 128x128 inputs is
//! 33.5 MB, MobileNetV2's 64x64x96 50 MB). An allocator that hands such memory back to the
//! system when it is freed and maps it anew for the next call page-faults every buffer in
//! again, each page cleared by the kernel: perf put a quarter of the CNN step in the
//! fault, TLB-shootdown and page-clearing paths under glibc's default thresholds.
//!
//! The engine allocates through mimalloc (the crate's global allocator, `lib.rs`): its
//! thread-local free lists serve the many small blocks of a loop step (the shapes, the
//! step's 16-64 KiB values) without glibc's bin searches and consolidation. One thread's
//! CPU time per Keras training step, mimalloc against glibc tuned as below, the two
//! builds taking turns: LSTM 5.5-5.6 against 6.1-6.5 ms, CNN 35-36 against 38-39 ms.
//! It is built without transparent huge pages (`no_thp`): on a kernel whose THP mode is
//! `madvise` with `defrag=madvise`, mimalloc's `MADV_HUGEPAGE` arenas made page faults
//! compact memory for 2 MiB pages, and building ResNet50 and running its first training
//! step took 1.1-3.0 s of one thread's CPU from one run to the next (27% of it clearing
//! huge pages) against glibc's 1.2. And its purging of freed memory (decommitted after
//! `purge_delay`, 1 s) is switched off, as glibc's heap below keeps freed memory: a step
//! longer than the delay page-faulted its buffers in again on the next one (ResNet50's
//! second step 0.98-1.16 s against 0.89-0.91). The process's resident memory stays at its
//! peak; `MIMALLOC_PURGE_DELAY` set by the user takes precedence.
//!
//! glibc's malloc still serves NumPy's and Python's buffers (the feeds, Keras's batches).
//! It serves large sizes with `mmap` (or returns them with `trim`) once they pass its
//! dynamic thresholds, and caps the mmap threshold at 32 MiB; so the thresholds are raised
//! and `mmap` is switched off for allocations altogether (`M_MMAP_MAX` 0): every block
//! comes from the heap, and free memory beyond 256 MiB at the top of the heap is still
//! returned. (Measured when the engine's buffers came from glibc too: CNN 991 -> 1,678
//! samples/s, MLP 19.1k -> 29.1k; 25,000 page faults per ResNet50 `predict` at batch 32
//! without `M_MMAP_MAX` 0.) glibc still maps a block too large for a thread's heap (64 MiB)
//! there.
//!
//! Both settings are process-wide, so they are applied once, when the extension loads, and
//! only where the user has not chosen them (`MIMALLOC_PURGE_DELAY`; on glibc
//! `MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`, `MALLOC_MMAP_MAX_`).

/// mimalloc's `mi_option_purge_delay` (`mimalloc.h` of the mimalloc version that
/// `libmimalloc-sys` builds; its Rust bindings do not name it). The test below checks it
/// against the option's default.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Switches mimalloc's purging of freed memory off (see the module comment) unless
/// `MIMALLOC_PURGE_DELAY` is set; returns whether it did.
pub fn tune_mimalloc() -> bool {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return false;
    }
    // SAFETY: mi_option_set only stores the option's value; mimalloc reads it when it
    // next decides whether to purge.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    true
}

/// Applies glibc's thresholds above (see the module comment); returns whether it did.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn purge_delay_is_the_option_it_names() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            return;
        }
        // SAFETY: reading and setting an option only reads and stores its value.
        unsafe {
            // mimalloc's default purge delay is 1000 ms; no other option defaults to it.
            let before = libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY);
            assert!(
                before == 1000 || before == -1,
                "option {MI_OPTION_PURGE_DELAY} is {before}"
            );
            assert!(tune_mimalloc());
            assert_eq!(libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY), -1);
        }
    }
}
