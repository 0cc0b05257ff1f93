//! The CPU decode loop allocates nothing per token: after a warm-up, decode steps through
//! `forward_into` with a reused logits buffer make no heap allocation, but for at most four
//! per kernel worker that had not yet run an attention unit (a counting global allocator
//! watches every thread, the kernel pool's too).

use anyhow::Result;
use candle_core::Device;
use sapient_llama::Logits;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

struct Counting;
static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

#[test]
fn decode_steps_allocate_nothing() -> Result<()> {
    let r = sapient_hub::Hub::new()?.fetch_preset("smollm2-135m-instruct", &mut |_| {})?;
    let mut m = sapient_llama::load(r.file("gguf")?, &Device::Cpu, Some(512))?;
    let prompt: Vec<u32> = (0..20u32).map(|i| 100 + i * 37 % 4000).collect();
    let mut logits = Vec::new();
    m.forward_into(&prompt, Logits::Last, &mut logits)?;
    let argmax = |l: &[f32]| l.iter().enumerate().fold(0, |b, (i, x)| if *x > l[b] { i } else { b }) as u32;
    let mut tok = argmax(&logits);
    // Warm-up: per-thread scratch and the pool's threads settle.
    for _ in 0..8 {
        m.forward_into(&[tok], Logits::Last, &mut logits)?;
        tok = argmax(&logits);
    }
    ALLOCS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    for _ in 0..32 {
        m.forward_into(&[tok], Logits::Last, &mut logits)?;
        tok = argmax(&logits);
    }
    COUNTING.store(false, Ordering::SeqCst);
    let n = ALLOCS.load(Ordering::SeqCst);
    // A kernel worker that the OS woke late in the warm-up (a busy machine) may run its
    // first attention unit here and size its per-thread scratch once, for the whole cache:
    // four vectors (the quantized queries, key block addresses, scores, runs of value
    // slots); anything per token would be 32 or more.
    let workers = sapient_tensor::kernels::pool::pool().threads() - 1;
    assert!(n <= 4 * workers, "{n} heap allocations in 32 decode steps ({workers} kernel workers)");
    Ok(())
}
