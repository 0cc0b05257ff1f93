//! Shared by the hostile-file tests of several crates (included with `#[path]`): a global
//! allocator that records, per thread, the peak of live heap bytes, and `hostile`, which runs a
//! loader on a hostile input and checks that it fails within a second without allocating more
//! than the input's size (plus a fixed allowance for error messages and small structures).
// Each test binary uses part of it.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::{Duration, Instant};

/// Heap bytes any loader may use besides those the input's size allows (messages, paths,
/// small vectors).
pub const SLACK: usize = 64 << 10;

pub struct Meter;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn note(delta: isize) {
    let _ = LIVE.try_with(|l| {
        let v = l.get() + delta;
        l.set(v);
        let _ = PEAK.try_with(|p| {
            if v > p.get() {
                p.set(v)
            }
        });
    });
}

unsafe impl GlobalAlloc for Meter {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note(l.size() as isize);
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note(l.size() as isize);
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        note(-(l.size() as isize));
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        note(new as isize - l.size() as isize);
        unsafe { System.realloc(p, l, new) }
    }
}

/// Runs `f` and returns its result, the peak of heap bytes it held on this thread above what
/// was live before, and its time.
pub fn measure<T>(f: impl FnOnce() -> T) -> (T, usize, Duration) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let t = Instant::now();
    let r = f();
    let elapsed = t.elapsed();
    let peak = PEAK.with(Cell::get) - base;
    (r, peak.max(0) as usize, elapsed)
}

/// Runs a loader on a hostile input of `input_len` bytes: it must fail within a second, with
/// a heap peak of at most `input_len` bytes (plus [`SLACK`]); returns the error's message.
pub fn hostile<T, E: std::fmt::Display>(name: &str, input_len: usize, f: impl FnOnce() -> Result<T, E>) -> String {
    let (r, peak, elapsed) = measure(f);
    let msg = match r {
        Ok(_) => panic!("{name}: the hostile input was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(elapsed < Duration::from_secs(1), "{name}: took {elapsed:?} ({msg})");
    assert!(
        peak <= input_len + SLACK,
        "{name}: allocated {peak} bytes for a {input_len}-byte input ({msg})"
    );
    msg
}

/// A small deterministic generator for mutation tests.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One to four mutations of `seed`: random bytes, extreme 8- and 4-byte values (counts,
/// lengths, offsets, dims), truncation, insertion, deletion, duplication of a stretch.
pub fn mutate(seed: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        if b.len() < 16 {
            break;
        }
        match rng.below(7) {
            0 => {
                let i = rng.below(b.len());
                b[i] = rng.next() as u8;
            }
            1 => {
                let i = rng.below(b.len() - 8);
                let v = [u64::MAX, 1 << 62, 1 << 32, 0, 255, 7, u32::MAX as u64][rng.below(7)];
                b[i..i + 8].copy_from_slice(&v.to_le_bytes());
            }
            2 => b.truncate(rng.below(b.len())),
            3 => {
                let i = rng.below(b.len());
                let extra: Vec<u8> = (0..rng.below(16)).map(|_| rng.next() as u8).collect();
                b.splice(i..i, extra);
            }
            4 => {
                let i = rng.below(b.len());
                let len = rng.below(32).min(b.len() - i);
                b.drain(i..i + len);
            }
            5 => {
                let i = rng.below(b.len() - 4);
                let v = [u32::MAX, 1 << 31, 0, 1, 64][rng.below(5)];
                b[i..i + 4].copy_from_slice(&v.to_le_bytes());
            }
            _ => {
                let i = rng.below(b.len());
                let len = rng.below(64).min(b.len() - i);
                let dup = b[i..i + len].to_vec();
                b.splice(i..i, dup);
            }
        }
    }
    b
}

/// Runs `exercise` on mutations of the seeds for at most `iterations` inputs or `budget`
/// time; a panic fails the test, naming the iteration and saving the input to the temp dir.
/// Returns how many inputs ran and how many `exercise` accepted.
pub fn mutation_run(
    name: &str,
    seeds: &[Vec<u8>],
    iterations: usize,
    budget: Duration,
    exercise: impl Fn(&[u8]) -> bool,
) -> (usize, usize) {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ name.len() as u64);
    let start = Instant::now();
    let (mut ran, mut accepted) = (0, 0);
    for i in 0..iterations {
        if start.elapsed() > budget {
            break;
        }
        let b = mutate(&seeds[i % seeds.len()], &mut rng);
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| exercise(&b))) {
            Ok(ok) => accepted += ok as usize,
            Err(_) => {
                let p = std::env::temp_dir().join(format!("{name}-mutation-crash-{i}"));
                let _ = std::fs::write(&p, &b);
                panic!("{name}: input {i} panicked; saved to {}", p.display());
            }
        }
        ran += 1;
    }
    eprintln!("{name}: {ran} mutated inputs, {accepted} accepted");
    (ran, accepted)
}
