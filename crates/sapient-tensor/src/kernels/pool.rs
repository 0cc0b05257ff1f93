//! A small persistent thread pool for the CPU kernels.
//!
//! Decode runs a few hundred tiny matrix-vector products per token; spawning work through a
//! general-purpose pool costs microseconds per call, which is a large share of a 5 ms token.
//! Here the workers spin briefly on an epoch counter after each job (so back-to-back kernels
//! start within nanoseconds) and then park on a condition variable, so an idle process uses
//! no CPU. One job runs at a time; a caller that finds the pool busy (another thread is
//! decoding) runs its job on its own thread instead of waiting.
//!
//! The number of threads is `SAPIENT_THREADS` if set, otherwise the number of available
//! cores.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a worker spins after a job before parking.
const SPIN: Duration = Duration::from_millis(2);

type Job = dyn Fn(usize, usize) + Sync;

struct Shared {
    epoch: AtomicUsize,
    done: AtomicUsize,
    /// The current job, valid while `epoch` is odd-numbered for this dispatch (see `run`).
    job: UnsafeCell<Option<*const Job>>,
    sleep: Mutex<()>,
    wake: Condvar,
    nthreads: usize,
    panicked: AtomicUsize,
}

// SAFETY: `job` is written only by the dispatching thread while every worker is idle (between
// `done` reaching the worker count and the next epoch bump), and read by workers only after
// they observe the new epoch (Acquire after the dispatcher's Release).
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

pub struct Pool {
    shared: Arc<Shared>,
    busy: Mutex<()>,
}

impl Pool {
    fn new(nthreads: usize) -> Self {
        let nthreads = nthreads.max(1);
        let shared = Arc::new(Shared {
            epoch: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            job: UnsafeCell::new(None),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
            nthreads,
            panicked: AtomicUsize::new(0),
        });
        for tid in 1..nthreads {
            let s = shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("sapient-kernel-{tid}"))
                .spawn(move || worker(s, tid));
            if spawned.is_err() {
                // Could not start all workers: fall back to a single thread.
                tracing::warn!("could not spawn kernel worker threads; running single-threaded");
                return Self::single();
            }
        }
        Self {
            shared,
            busy: Mutex::new(()),
        }
    }

    fn single() -> Self {
        Self {
            shared: Arc::new(Shared {
                epoch: AtomicUsize::new(0),
                done: AtomicUsize::new(0),
                job: UnsafeCell::new(None),
                sleep: Mutex::new(()),
                wake: Condvar::new(),
                nthreads: 1,
                panicked: AtomicUsize::new(0),
            }),
            busy: Mutex::new(()),
        }
    }

    /// Threads a job is split across.
    pub fn threads(&self) -> usize {
        self.shared.nthreads
    }

    /// Run `f(thread_index, thread_count)` on every thread of the pool (the caller is thread
    /// 0) and return when all have finished.
    pub fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        let n = self.shared.nthreads;
        if n == 1 {
            f(0, 1);
            return;
        }
        let Ok(_guard) = self.busy.try_lock() else {
            // Someone else is using the pool: do the work here, alone.
            f(0, 1);
            return;
        };
        let s = &*self.shared;
        // SAFETY: workers are idle (the previous run waited for all of them), and the pointer
        // is only dereferenced before this function returns.
        unsafe {
            let erased: *const Job = std::mem::transmute::<&(dyn Fn(usize, usize) + Sync), &'static Job>(f);
            *s.job.get() = Some(erased);
        }
        s.done.store(0, Ordering::Relaxed);
        s.epoch.fetch_add(1, Ordering::Release);
        {
            // Wake parked workers. Taking the lock orders this with a worker's check-then-wait.
            let _l = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(0, n)));
        let mut spins = 0u32;
        while s.done.load(Ordering::Acquire) < n - 1 {
            spins = spins.wrapping_add(1);
            if spins % 4096 == 0 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        // SAFETY: all workers are done with the job.
        unsafe {
            *s.job.get() = None;
        }
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if s.panicked.swap(0, Ordering::Relaxed) != 0 {
            panic!("a sapient kernel worker panicked");
        }
    }
}

fn worker(s: Arc<Shared>, tid: usize) {
    let mut seen = 0usize;
    loop {
        // Spin for a while, then park.
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if s.epoch.load(Ordering::Acquire) != seen {
                break;
            }
            spins = spins.wrapping_add(1);
            if spins % 1024 == 0 && start.elapsed() > SPIN {
                let mut g = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
                while s.epoch.load(Ordering::Acquire) == seen {
                    g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
                }
                break;
            }
            std::hint::spin_loop();
        }
        seen = s.epoch.load(Ordering::Acquire);
        // SAFETY: the dispatcher set the job before bumping the epoch and keeps it alive until
        // every worker has reported done.
        let job = unsafe { *s.job.get() };
        if let Some(job) = job {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
                (*job)(tid, s.nthreads)
            }));
            if r.is_err() {
                s.panicked.fetch_add(1, Ordering::Relaxed);
            }
        }
        s.done.fetch_add(1, Ordering::Release);
    }
}

/// The process-wide kernel pool.
pub fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let n = std::env::var("SAPIENT_THREADS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
        Pool::new(n.min(256))
    })
}

/// The `[start, end)` share of `n` items for thread `tid` of `nth`, in multiples of `align`.
pub fn split(n: usize, tid: usize, nth: usize, align: usize) -> (usize, usize) {
    let align = align.max(1);
    let units = n.div_ceil(align);
    let per = units / nth;
    let extra = units % nth;
    let s = tid * per + tid.min(extra);
    let e = s + per + usize::from(tid < extra);
    ((s * align).min(n), (e * align).min(n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn split_covers_everything_once() {
        for n in [0, 1, 7, 64, 1000, 1537] {
            for nth in 1..5 {
                for align in [1, 4, 32] {
                    let mut covered = vec![0u8; n];
                    for t in 0..nth {
                        let (s, e) = split(n, t, nth, align);
                        for c in &mut covered[s..e] {
                            *c += 1;
                        }
                    }
                    assert!(covered.iter().all(|&c| c == 1), "n={n} nth={nth} align={align}");
                }
            }
        }
    }

    #[test]
    fn every_thread_runs_each_job_once() {
        let p = Pool::new(3);
        let total = AtomicU64::new(0);
        for round in 0..2000u64 {
            p.run(&|tid, nth| {
                assert_eq!(nth, 3);
                total.fetch_add(round * 10 + tid as u64, Ordering::Relaxed);
            });
        }
        let want: u64 = (0..2000u64).map(|r| 3 * r * 10 + 3).sum();
        assert_eq!(total.load(Ordering::Relaxed), want);
    }

    #[test]
    fn workers_wake_after_parking() {
        let p = Pool::new(2);
        let hits = AtomicU64::new(0);
        p.run(&|_, _| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        std::thread::sleep(SPIN * 3); // the worker parks
        p.run(&|_, _| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 4);
    }
}
