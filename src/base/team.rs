//! A second thread kept polling next to a loop or a short run, for halves of small kernels.
//!
//! A Keras LSTM step runs a few dozen kernels of 2-30 us each (64x64x256 products, the
//! cell's elementwise groups), one after the other. Splitting one over the rayon pool
//! costs a wake-up of a sleeping worker, longer than the work (measured slower, see
//! docs/performance.md); so they ran on one core while the other slept. While a loop runs
//! (and during a short top-level run, `cpu::run`), `with_team` keeps one other worker
//! polling a slot instead, so a kernel can hand it half of its work for the price of a
//! cache-line exchange (`split2`). The leading thread and its polling helper are a *team*,
//! OpenMP's word for the threads that share one parallel region.
//!
//! The helper is asked for, never relied on: the thread that posts a job takes the second
//! half back when the helper has not started it, so a pool with one thread, a helper that
//! never got scheduled, or one busy with other rayon work only cost the split. Every 64
//! polls the helper also runs pending rayon work (`rayon::yield_now`), so kernels that use
//! the pool keep both threads (polling the pool on every round measured slower: its
//! steals contend with the leader's own deque).
//!
//! A polling helper only pays where it has a core of its own. On a machine short of cores
//! (another busy process on a 2-core VM) it competed with the leader for one, and a half
//! it had taken could wait a scheduler time slice: the Keras LSTM epoch went 0.30 -> 0.45 s
//! next to one busy process. So the idle helper yields to the OS every 16 polls, a leader
//! waiting over `SPIN_BEFORE_YIELD` for a half yields between checks, and a team stands down
//! (`stalled`) when most of the halves posted in two windows of `WINDOW` in a row were
//! taken back by their posters: later kernels run whole, the helper returns to the pool,
//! and the next few teams are not formed (`backoff`). Uncontended, 0-2 of a window's 64
//! are taken back, but on a shared VM a lone window now and then loses most (the helper
//! descheduled for a few ms): on one window that stood teams down 4-7 times per five
//! LSTM epochs, costing ~15%; next to a busy process the windows run 60-64 of 64.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

/// The slot between the thread running the loop and its helper.
pub struct Team {
    /// A posted job, or null; the helper takes it by swapping in null.
    slot: AtomicPtr<Job<'static>>,
    /// Set when the loop is over: the helper returns to the pool.
    stop: AtomicBool,
    /// Set when most recent halves were taken back by their posters (`split2`): the
    /// helpers are not getting a core. Later kernels run whole, and the helper stops
    /// polling, so neither thread burns the time the other needs.
    stalled: AtomicBool,
    owner: std::thread::ThreadId,
}

struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    done: AtomicBool,
    /// The helper's half panicked (the poster re-raises once it has waited).
    panicked: AtomicBool,
}

thread_local! {
    /// The team of the loop this thread is running, if any.
    static TEAM: Cell<*const Team> = const { Cell::new(std::ptr::null()) };
}

/// Runs `f` with a helper thread polling for work (see the module comment); on this thread
/// alone where the pool has one thread or this thread already leads a team (nested loops).
/// Must be called on a rayon worker (`cpu::on_worker`).
pub fn with_team<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_num_threads() < 2 || rayon::current_thread_index().is_none() || available() {
        return f();
    }
    // After a stall the next few teams are not formed (`backoff`): the machine may be
    // short of cores.
    if BACKOFF.load(Ordering::Relaxed) > 0 {
        BACKOFF.fetch_sub(1, Ordering::Relaxed);
        return f();
    }
    let team = Team {
        slot: AtomicPtr::new(std::ptr::null_mut()),
        stop: AtomicBool::new(false),
        stalled: AtomicBool::new(false),
        owner: std::thread::current().id(),
    };
    rayon::scope(|s| {
        s.spawn(|_| team.serve());
        struct Reset;
        impl Drop for Reset {
            fn drop(&mut self) {
                TEAM.set(std::ptr::null());
            }
        }
        TEAM.set(&team);
        let reset = Reset;
        let r = f();
        drop(reset);
        team.stop.store(true, Ordering::Release);
        if team.stalled.load(Ordering::Relaxed) {
            BACKOFF.store(
                backoff(STREAK.fetch_add(1, Ordering::Relaxed) + 1),
                Ordering::Relaxed,
            );
        } else {
            STREAK.store(0, Ordering::Relaxed);
        }
        r
    })
}

/// Halves posted and taken back since the last check (`split2`), process-wide.
static WIN_POSTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
static WIN_BACK: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
const WINDOW: u32 = 64;
/// Whether most halves of the window before the last were taken back.
static WIN_BEFORE_MOST: AtomicBool = AtomicBool::new(false);

/// Teams not formed after one stalled (`with_team`), process-wide.
static BACKOFF: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
/// Teams skipped after the latest of several stalls in a row (a power of two).
const STALL_BACKOFF: u32 = 32;
/// Teams that stalled in a row.
static STREAK: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Teams not formed after the `streak`-th stall in a row: 2, 4, .. up to `STALL_BACKOFF`.
/// A lone stall on a shared VM (the helper's thread and the leader's briefly on one core)
/// costs two teams; next to a busy process the skips soon reach `STALL_BACKOFF`. (A flat
/// 32 after every stall took a Keras LSTM epoch's teams down for half of it, 3-7 times per
/// five epochs; the LSTM row ran 0.90-1.60x as fast with the doubling, ahead in 8 of 9 pairs.)
fn backoff(streak: u32) -> u32 {
    1 << streak.clamp(1, STALL_BACKOFF.ilog2())
}

/// How long the leader spins waiting for the helper's half before it yields its core
/// between checks (the helper may have been preempted on a machine short of cores).
const SPIN_BEFORE_YIELD: std::time::Duration = std::time::Duration::from_micros(200);

impl Team {
    fn serve(&self) {
        // The leader itself may pop this job while it waits inside a rayon call of the
        // loop: it must not spin then, since the loop (which would stop it) cannot go on.
        if std::thread::current().id() == self.owner {
            return;
        }
        let mut idle = 0u32;
        while !self.stop.load(Ordering::Acquire) && !self.stalled.load(Ordering::Relaxed) {
            let p = self.slot.load(Ordering::Acquire);
            if !p.is_null()
                && self
                    .slot
                    .compare_exchange(p, std::ptr::null_mut(), Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                // SAFETY: the poster waits for `done` once the job was taken from the slot
                // (`split2`), so the job and what it borrows outlive this call.
                let job = unsafe { &*p };
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (job.f)(1)));
                job.panicked.store(r.is_err(), Ordering::Relaxed);
                job.done.store(true, Ordering::Release);
                continue;
            }
            idle = idle.wrapping_add(1);
            if idle.is_multiple_of(64) && matches!(rayon::yield_now(), Some(rayon::Yield::Executed))
            {
                continue;
            }
            if idle.is_multiple_of(16) {
                // Cheap when this core has nothing else to run; where it has (a machine
                // short of cores), the leader or another process gets it.
                std::thread::yield_now();
            }
            std::hint::spin_loop();
        }
    }
}

/// Whether this thread leads a team, so `split2` may run the halves on two threads.
pub fn available() -> bool {
    !TEAM.get().is_null()
}

/// Runs `f(0)` and `f(1)`, on this thread and the team's helper when there is one, and
/// returns when both have run.
pub fn split2(f: &(dyn Fn(usize) + Sync)) {
    // SAFETY: `with_team` clears TEAM before its team goes out of scope.
    let Some(team) =
        (unsafe { TEAM.get().as_ref() }).filter(|t| !t.stalled.load(Ordering::Relaxed))
    else {
        f(0);
        f(1);
        return;
    };
    let job = Job {
        f,
        done: AtomicBool::new(false),
        panicked: AtomicBool::new(false),
    };
    // The slot's type erases the job's lifetime: `Posted` takes the job back or waits for
    // the helper to finish it before `job` goes out of scope, also when `f(0)` unwinds.
    let p = &job as *const Job<'_> as *mut Job<'static>;
    team.slot.store(p, Ordering::Release);
    let mut posted = Posted {
        team,
        p,
        job: &job,
        settled: false,
    };
    f(0);
    let taken_back = posted.settle();
    if taken_back {
        // Not taken: the helper is busy or absent.
        f(1);
    }
    // Most of the halves of two windows in a row (`WINDOW` halves each, posted by any team)
    // taken back means the helpers are not getting a core.
    let back = if taken_back {
        WIN_BACK.fetch_add(1, Ordering::Relaxed) + 1
    } else {
        WIN_BACK.load(Ordering::Relaxed)
    };
    if WIN_POSTED.fetch_add(1, Ordering::Relaxed) + 1 >= WINDOW {
        WIN_POSTED.store(0, Ordering::Relaxed);
        WIN_BACK.store(0, Ordering::Relaxed);
        let most = 2 * back > WINDOW;
        if most && WIN_BEFORE_MOST.load(Ordering::Relaxed) {
            team.stalled.store(true, Ordering::Relaxed);
        }
        WIN_BEFORE_MOST.store(most, Ordering::Relaxed);
    }
    if job.panicked.load(Ordering::Relaxed) {
        panic!("a kernel's second half panicked on the loop's helper thread");
    }
}

struct Posted<'a> {
    team: &'a Team,
    p: *mut Job<'static>,
    job: &'a Job<'a>,
    settled: bool,
}

impl Posted<'_> {
    /// Takes the job back (true) or waits until the helper has run it (false).
    fn settle(&mut self) -> bool {
        self.settled = true;
        if self
            .team
            .slot
            .compare_exchange(
                self.p,
                std::ptr::null_mut(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        {
            return true;
        }
        let mut spins = 0u32;
        let mut since: Option<std::time::Instant> = None;
        while !self.job.done.load(Ordering::Acquire) {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) {
                let t0 = *since.get_or_insert_with(std::time::Instant::now);
                if t0.elapsed() > SPIN_BEFORE_YIELD {
                    std::thread::yield_now();
                }
            }
            std::hint::spin_loop();
        }
        false
    }
}

impl Drop for Posted<'_> {
    fn drop(&mut self) {
        if !self.settled {
            self.settle();
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn backoff_doubles_to_its_cap() {
        let skips: Vec<u32> = (1..=7).map(super::backoff).collect();
        assert_eq!(skips, [2, 4, 8, 16, 32, 32, 32]);
    }
}
