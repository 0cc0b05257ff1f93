//! Shared by the hostile-file tests of several crates (included with `#[path]`): a global
//! allocator that records, per thread, the peak of live heap bytes, and `hostile`, which runs a
//! loader on a hostile input and checks that it fails within a second without allocating more
//! than the input's size (plus a fixed allowance for error messages and small structures).

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
