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
//! The engine's global allocator (`EngineAlloc`, `lib.rs`) takes blocks up to `SMALL_MAX`
//! (1 MiB) from mimalloc and larger ones from the system's malloc. A recurrent loop step
//! allocates and frees dozens of small blocks (its shapes, its 16-64 KiB values), which
//! mimalloc's thread-local free lists serve without glibc's bin searches and
//! consolidation (`_int_malloc`, `_int_free` and `malloc_consolidate` were ~4% of a Keras
//! LSTM step on one thread): one thread's CPU time per LSTM training step 5.5-5.6 ms
//! against 6.1-6.5 with glibc alone, the builds taking turns. Large blocks stay with
//! glibc: with every block from mimalloc, the products and convolutions of the separable
//! model of `bench_models.py` ran ~20% slower on one thread (1,490-1,570 samples per CPU
//! second against 1,840-1,980; the same kernels, the GEMM microkernel's share up by half:
//! mimalloc places large blocks at aligned addresses, glibc after a header), and the
//! resident memory of ResNet50 grew by ~13%. mimalloc is built without transparent huge
//! pages (`no_thp`): on a kernel whose THP mode is `madvise` with `defrag=madvise`, its
//! `MADV_HUGEPAGE` arenas made page faults compact memory for 2 MiB pages, and the first
//! ResNet50 training step took 1.1-3.0 s of one thread's CPU from run to run against 1.2.
//!
//! glibc's malloc serves large sizes with `mmap` (or returns them with `trim`) once they
//! pass its dynamic thresholds, and caps the mmap threshold at 32 MiB; so the thresholds
//! are raised and `mmap` is switched off for allocations altogether (`M_MMAP_MAX` 0): every
//! block comes from the heap, and free memory beyond 256 MiB at the top of the heap is
//! still returned. (Measured: CNN 991 -> 1,678 samples/s, MLP 19.1k -> 29.1k; 25,000 page
//! faults per ResNet50 `predict` at batch 32 without `M_MMAP_MAX` 0, 580 -> 551 ms of one
//! thread's CPU; the peak resident memory of those runs fell, ResNet50 399 -> 383 MiB,
//! since a freed block is reused rather than mapped anew.) glibc still maps a block too
//! large for a thread's heap (64 MiB) there.
//!
//! glibc also gives each thread that allocates while another holds the lock an arena of
//! its own, and a block freed goes back to the arena it came from: once the executor runs
//! two kernels at the same time (`runtime::cpu`'s pairs), their results come from the
//! workers' arenas, each keeping its own free blocks, and ResNet50's peak RSS grew from
//! 916 to 1,044 MiB. Only blocks over 1 MiB come to glibc, a few per kernel, so one arena
//! (`M_ARENA_MAX` 1) serves them all without contention: 916 MiB, and 947 against 976-980
//! before the pairs.
//!
//! The settings are process-wide, so they are applied once, when the extension loads,
//! only on glibc, and only where the user has not chosen them (`MALLOC_MMAP_THRESHOLD_`,
//! `MALLOC_TRIM_THRESHOLD_`, `MALLOC_MMAP_MAX_`, `MALLOC_ARENA_MAX`).

/// Applies glibc's thresholds above (see the module comment); returns whether it did.
pub fn tune_malloc() -> bool {
    let user_set = |v: &str| std::env::var_os(v).is_some();
    if user_set("MALLOC_MMAP_THRESHOLD_")
        || user_set("MALLOC_TRIM_THRESHOLD_")
        || user_set("MALLOC_MMAP_MAX_")
        || user_set("MALLOC_ARENA_MAX")
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
            && libc::mallopt(libc::M_ARENA_MAX, 1) == 1
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_thresholds() -> bool {
    false
}

/// Blocks up to this many bytes come from mimalloc, larger ones from the system's malloc.
pub const SMALL_MAX: usize = 1 << 20;

/// The global allocator: mimalloc for blocks up to `SMALL_MAX` bytes, the system's
/// malloc (glibc, tuned by `tune_malloc`) above (see the module comment).
pub struct EngineAlloc;

/// The allocator that serves (and frees) blocks of `size` bytes.
fn by_size(size: usize) -> &'static dyn std::alloc::GlobalAlloc {
    if size <= SMALL_MAX {
        &mimalloc::MiMalloc
    } else {
        &std::alloc::System
    }
}

// SAFETY: every block is freed (and grown or shrunk) by the allocator that made it: the
// layout's size, which Rust passes to `dealloc` and `realloc` unchanged, says which.
unsafe impl std::alloc::GlobalAlloc for EngineAlloc {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's layout contract is passed on.
        unsafe { by_size(l.size()).alloc(l) }
    }

    unsafe fn alloc_zeroed(&self, l: std::alloc::Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe { by_size(l.size()).alloc_zeroed(l) }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        // SAFETY: `p` came from the allocator its size selects (`alloc`).
        unsafe { by_size(l.size()).dealloc(p, l) }
    }

    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, size: usize) -> *mut u8 {
        let side = |n: usize| n <= SMALL_MAX;
        // SAFETY: `p` came from the allocator `l`'s size selects; a block that changes
        // sides is copied into a new block from the other one and freed by its own.
        unsafe {
            if side(l.size()) == side(size) {
                return by_size(size).realloc(p, l, size);
            }
            let new = std::alloc::Layout::from_size_align_unchecked(size, l.align());
            let q = self.alloc(new);
            if !q.is_null() {
                std::ptr::copy_nonoverlapping(p, q, l.size().min(size));
                self.dealloc(p, l);
            }
            q
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SMALL_MAX;

    #[test]
    fn blocks_keep_their_bytes_when_they_grow_and_shrink_across_the_allocators() {
        let fill = |n: usize| (0..n).map(|i| (i * 7 + 3) as u8).collect::<Vec<u8>>();
        for (from, to) in [
            (1000, SMALL_MAX - 1),
            (SMALL_MAX, SMALL_MAX + 1),
            (4096, 3 * SMALL_MAX),
            (2 * SMALL_MAX, 3 * SMALL_MAX),
        ] {
            let mut v = fill(from);
            v.reserve_exact(to - from);
            assert!(v.capacity() >= to);
            assert_eq!(v, fill(from));
            v.extend((from..to).map(|i| (i * 7 + 3) as u8));
            assert_eq!(v, fill(to));
            v.truncate(from);
            v.shrink_to_fit();
            assert_eq!(v, fill(from));
        }
        let zeros = vec![0u64; SMALL_MAX]; // alloc_zeroed from the system's malloc
        assert!(zeros.iter().all(|&z| z == 0));
    }
}
