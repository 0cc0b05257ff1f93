//! The paged KV cache on the CPU: writing a step's keys (transposed per block) and values
//! into their slots, and attention of the step's queries over each sequence's blocks.

use super::*;

/// Keys go transposed per block: component `c` of the key at slot `blk * bs + j` to
/// `kc[blk * bs * kv_out + c * bs + j]`, so that [`kernels::scores_chunks`] reads 16
/// consecutive positions' component `c` at once. Values go in rows. A batch's rows are
/// split over the kernel pool.
#[allow(clippy::too_many_arguments)]
pub(super) fn write_kv(kv: &mut HostKv, layer: usize, kv_out: usize, k: &mut [f32], v: &[f32], step: &Step, per: usize, prep: kernels::Prep<'_>) {
    let n = step.slot.len();
    let bs = kv.block_size();
    assert!(k.len() >= n * kv_out && v.len() >= n * kv_out, "write_kv: buffers shorter than the rows");
    let kptr = OutPtr(k.as_mut_ptr());
    // Rows `r` of the keys, made by `prep` first (the rotation), on this range's thread.
    let keys = |r: std::ops::Range<usize>| -> *const f32 {
        // SAFETY: rows `r` of `k` (checked long enough above, exclusively borrowed for the
        // call); each range is given to one thread only.
        let kr = unsafe { std::slice::from_raw_parts_mut(kptr.ptr().add(r.start * kv_out), r.len() * kv_out) };
        prep(r, kr);
        kr.as_ptr()
    };
    let per = per.max(1);
    let run = |rows: &(dyn Fn(std::ops::Range<usize>) + Sync)| {
        if per >= n {
            rows(0..n);
        } else {
            pool::pool().run_chunks(n.div_ceil(per), &|c| rows(c * per..((c + 1) * per).min(n)));
        }
    };
    match kv.layer_mut(layer) {
        KvLayerMut::F16 { k: kc, v: vc } => {
            let slots = kc.len() / kv_out.max(1);
            // `plan` reserves every slot inside the pool; the unchecked writes below rely on it.
            assert!(step.slot.iter().all(|&s| s < slots) && vc.len() >= slots * kv_out, "write_kv: a slot lies outside the KV cache");
            let (kp, vp) = (OutPtr(kc.as_mut_ptr()), OutPtr(vc.as_mut_ptr()));
            run(&|r: std::ops::Range<usize>| {
                let mut kh = [0u16; 1024];
                // SAFETY: the range's rows, made by `keys` and read by this thread only.
                let (k, r0) = (unsafe { std::slice::from_raw_parts(keys(r.clone()), r.len() * kv_out) }, r.start);
                for i in r {
                    let slot = step.slot[i];
                    // SAFETY: every slot is inside the layer's caches (checked above) and each row
                    // has a slot of its own (`plan` checks), so rows write disjoint elements; the
                    // caches outlive the call.
                    let vrow = unsafe { std::slice::from_raw_parts_mut(vp.ptr().add(slot * kv_out), kv_out) };
                    kernels::f32_to_f16(&v[i * kv_out..(i + 1) * kv_out], vrow);
                    let base = slot / bs * bs * kv_out + slot % bs;
                    for c0 in (0..kv_out).step_by(kh.len()) {
                        let c1 = (c0 + kh.len()).min(kv_out);
                        kernels::f32_to_f16(&k[(i - r0) * kv_out + c0..(i - r0) * kv_out + c1], &mut kh[..c1 - c0]);
                        for (c, &x) in (c0..c1).zip(&kh[..c1 - c0]) {
                            // SAFETY: as above; `base + c * bs` is inside the slot's block.
                            unsafe { *kp.ptr().add(base + c * bs) = x };
                        }
                    }
                }
            });
        }
        // Keys by four components (`[block][c / 4][position in block][4]`, biased by
        // 128), their scales `[block][group][position in block]`; values and their scales
        // in rows (see `kv.rs`).
        KvLayerMut::Q8 { k: kc, v: vc, ks, vs } => {
            const G: usize = kernels::Q8_GROUP;
            let ngr = kv_out / G;
            let slots = kc.len() / kv_out.max(1);
            assert!(
                step.slot.iter().all(|&s| s < slots) && vc.len() >= slots * kv_out && ks.len() >= slots * ngr && vs.len() >= slots * ngr && kv_out.is_multiple_of(G),
                "write_kv: a slot lies outside the KV cache"
            );
            let (kp, vp, ksp, vsp) = (OutPtr(kc.as_mut_ptr()), OutPtr(vc.as_mut_ptr()), OutPtr(ks.as_mut_ptr()), OutPtr(vs.as_mut_ptr()));
            run(&|r: std::ops::Range<usize>| {
                let (mut kq, mut kd) = ([0i8; 1024], [0u16; 1024 / G]);
                // SAFETY: the range's rows, made by `keys` and read by this thread only.
                let (k, r0) = (unsafe { std::slice::from_raw_parts(keys(r.clone()), r.len() * kv_out) }, r.start);
                for i in r {
                    let slot = step.slot[i];
                    // SAFETY: as for f16: slots inside the caches (checked above), one per
                    // row, so rows write disjoint elements.
                    let (vrow, vsrow) = unsafe {
                        (std::slice::from_raw_parts_mut(vp.ptr().add(slot * kv_out), kv_out), std::slice::from_raw_parts_mut(vsp.ptr().add(slot * ngr), ngr))
                    };
                    kernels::quantize_q8_f16(&v[i * kv_out..(i + 1) * kv_out], vrow, vsrow);
                    let (blk, j) = (slot / bs, slot % bs);
                    for c0 in (0..kv_out).step_by(kq.len()) {
                        let c1 = (c0 + kq.len()).min(kv_out);
                        kernels::quantize_q8_f16(&k[(i - r0) * kv_out + c0..(i - r0) * kv_out + c1], &mut kq[..c1 - c0], &mut kd[..(c1 - c0) / G]);
                        for (c, x) in (c0..c1).step_by(4).zip(kq[..c1 - c0].chunks_exact(4)) {
                            let quad = u32::from_le_bytes([x[0] as u8, x[1] as u8, x[2] as u8, x[3] as u8]) ^ 0x8080_8080;
                            // SAFETY: as above; the quad lies inside the slot's block.
                            unsafe { (kp.ptr().add(blk * bs * kv_out + c / 4 * 4 * bs + 4 * j) as *mut u32).write_unaligned(quad) };
                        }
                        for (g, &d) in (c0 / G..c1 / G).zip(&kd[..(c1 - c0) / G]) {
                            // SAFETY: as above; inside the block's scales.
                            unsafe { *ksp.ptr().add(blk * bs * ngr + g * bs + j) = d };
                        }
                    }
                }
            });
        }
    }
}

pub(super) type Scratch = (Vec<f32>, Vec<usize>, Vec<usize>, Vec<kernels::QueryQ8>, Vec<(usize, usize)>);

thread_local! {
    /// A worker's attention scratch: scores (then weights), key-chunk offsets, their
    /// scales' offsets, the quantized queries (8-bit cache) and the runs of value slots.
    static SCORES: RefCell<Scratch> = const { RefCell::new((Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new())) };
}

/// Calls `f(slot, t, len)` for each stretch `t..t + len` of positions `a..b` of a sequence
/// whose cache slots are consecutive (`slot..slot + len`): a block, or several blocks that
/// follow each other in the pool.
#[inline]
pub(super) fn runs(tab: &[u32], bs: usize, a: usize, b: usize, mut f: impl FnMut(usize, usize, usize)) {
    let mut t = a;
    while t < b {
        let s0 = tab[t / bs] as usize * bs + t % bs;
        let mut end = (t / bs + 1) * bs;
        while end < b && tab[end / bs] == tab[end / bs - 1] + 1 {
            end += bs;
        }
        let end = end.min(b);
        f(s0, t, end - t);
        t = end;
    }
}

/// How many of a unit's values (of one KV head) [`attention`] asks into L2 before scoring its
/// keys: 2048 of 64 f16 components are 256 KiB (half that in 8 bits), a quarter of a Zen 4
/// core's L2, so those fetched first are still there when the values are summed.
pub(super) const PREFETCH_VALUES: usize = 2048;

/// Causal (and sliding-window) grouped-query attention of every sequence of a batch: the
/// rows of `seg` at positions `seg.start..seg.start + seg.n` over that sequence's cached
/// keys and values (its block table in `tabs`). Keys are stored transposed per block
/// (`[block][kv head x head dim][position in block]`, see `Cpu::write_kv`), values in rows
/// (`[slot][kv head x head dim]`).
///
/// A unit of work is up to [`kernels::MAX_QUERIES`] queries that share a key/value head:
/// the query heads of a group, and consecutive rows of the sequence when the group has few
/// heads. The unit's keys (from its first row's window start to its last row's position, in
/// chunks of 16) are scored for all its queries at once, so each key is read and converted
/// once for all of them. Each query's softmax then runs over exactly its own keys, and its
/// weights outside them are zero, which adds nothing to its values (`fma(0, v, y) = y`). So
/// every row's result is what it gives alone in a decode step, bit for bit, whatever the
/// batch, and wherever its blocks lie.
#[allow(clippy::too_many_arguments)]
pub(super) fn attention(d: &Dims, window: Option<usize>, sinks: Option<&[f32]>, q: &[f32], layer: KvLayer<'_>, segs: &[Seg], tabs: &[u32], bs: usize, units_at: &mut Vec<usize>, out: &mut [f32]) {
    const MQ: usize = kernels::MAX_QUERIES;
    let (nh, nkv, hd) = (d.heads, d.kv_heads, d.head_dim);
    let n_rep = nh / nkv;
    let kv_out = nkv * hd;
    let scale = d.attn_scale;
    // Heads per unit (the group's heads in near-equal parts) and rows per unit.
    let head_parts = n_rep.div_ceil(MQ);
    let hh = n_rep.div_ceil(head_parts);
    let rr = (MQ / hh).max(1);
    units_at.clear();
    units_at.push(0);
    for s in segs {
        let last = units_at[units_at.len() - 1];
        units_at.push(last + s.n.div_ceil(rr) * nkv * head_parts);
    }
    let units = units_at[units_at.len() - 1];
    let units_at = &units_at[..];
    let out_ptr = OutPtr(out.as_mut_ptr());
    let lo = |pos: usize| window.map_or(0, |w| (pos + 1).saturating_sub(w));
    let pool_slots = match layer {
        KvLayer::F16 { k, .. } => k.len(),
        KvLayer::Q8 { k, .. } => k.len(),
    } / kv_out.max(1);
    const G: usize = kernels::Q8_GROUP;
    let ngr = kv_out / G;
    let work = |u0: usize, u1: usize| {
        let out_ptr = &out_ptr;
        SCORES.with(|cell| {
            let (s, bases, sbases, qq, vruns) = &mut *cell.borrow_mut();
            if qq.len() < MQ {
                qq.resize_with(MQ, Default::default);
            }
            for u in u0..u1 {
                let si = units_at.partition_point(|&x| x <= u) - 1;
                let seg = &segs[si];
                let tab = &tabs[seg.tab0..seg.tab0 + seg.tabn];
                let u = u - units_at[si];
                let (rg, rest) = (u / (nkv * head_parts), u % (nkv * head_parts));
                let (g, part) = (rest / head_parts, rest % head_parts);
                let h0 = g * n_rep + part * hh;
                let k = (n_rep - part * hh).min(hh);
                let i0 = rg * rr;
                let rows = (seg.n - i0).min(rr);
                let nq = rows * k;
                let pos0 = seg.start + i0;
                let (first, last) = (lo(pos0), pos0 + rows - 1);
                let c0 = first / 16 * 16;
                let c1 = (last + 1).div_ceil(16) * 16;
                let ostride = c1 - c0;
                bases.clear();
                // Room for every block of positions the pool holds, as for the scores below.
                bases.reserve((pool_slots + 32) / 16);
                let q8 = matches!(layer, KvLayer::Q8 { .. });
                // Keys of the 8-bit cache go by four components (4 bytes a position).
                let pw = if q8 { 4 } else { 1 };
                bases.extend((c0..c1).step_by(16).map(|t| tab[t / bs] as usize * bs * kv_out + g * hd * bs + pw * (t % bs)));
                if q8 {
                    sbases.clear();
                    sbases.reserve((pool_slots + 32) / 16);
                    sbases.extend((c0..c1).step_by(16).map(|t| tab[t / bs] as usize * bs * ngr + g * hd / G * bs + t % bs));
                }
                if s.len() < nq * ostride {
                    // Room for every position the pool holds: growing a key at a time would
                    // reallocate now and then during decode.
                    s.resize(nq * ostride.max(pool_slots + 16), 0.0);
                }
                // Query `qi` is row `qi / k` of the unit, head `h0 + qi % k`.
                let qrow = |qi: usize| seg.row0 + i0 + qi / k;
                let qv: [&[f32]; MQ] = std::array::from_fn(|qi| {
                    let (i, h) = (qrow(qi.min(nq - 1)), h0 + qi.min(nq - 1) % k);
                    &q[i * nh * hd + h * hd..i * nh * hd + (h + 1) * hd]
                });
                // The runs of value slots, for every call of the values below; the first of
                // them are on their way into L2 while the keys are scored.
                vruns.clear();
                vruns.reserve(pool_slots / bs.max(1) + 1);
                runs(tab, bs, first, last + 1, |sl, _, l| vruns.push((sl, l)));
                match layer {
                    KvLayer::F16 { k: kc, v: vc } => {
                        kernels::prefetch_values(vc, kv_out, g * hd, hd, vruns, PREFETCH_VALUES);
                        kernels::scores_chunks(&qv[..nq], kc, bases, bs, scale, &mut s[..nq * ostride], ostride)
                    }
                    KvLayer::Q8 { k: kc, ks, v: vc, vs } => {
                        // The values and their scales.
                        kernels::prefetch_values(vc, kv_out, g * hd, hd, vruns, PREFETCH_VALUES);
                        kernels::prefetch_values(vs, ngr, g * hd / G, hd / G, vruns, PREFETCH_VALUES);
                        for (x, y) in qq.iter_mut().zip(&qv[..nq]) {
                            x.set(y);
                        }
                        let qr: [&kernels::QueryQ8; MQ] = std::array::from_fn(|i| &qq[i.min(nq - 1)]);
                        kernels::scores_chunks_q8(&qr[..nq], kc, ks, bases, sbases, bs, scale, &mut s[..nq * ostride], ostride);
                    }
                }
                for qi in 0..nq {
                    let p = pos0 + qi / k;
                    let w = &mut s[qi * ostride..(qi + 1) * ostride];
                    let (a, b) = (lo(p) - c0, p + 1 - c0);
                    let inv = match sinks {
                        None => kernels::softmax_unnormalized(&mut w[a..b]),
                        Some(sk) => kernels::softmax_with_sink(&mut w[a..b], sk[h0 + qi % k]),
                    };
                    for x in &mut w[a..b] {
                        *x *= inv;
                    }
                    w[first - c0..a].fill(0.0);
                    w[b..last + 1 - c0].fill(0.0);
                }
                let s = &s[..nq * ostride];
                for q0 in (0..nq).step_by(kernels::MAX_VALUE_ROWS) {
                    let m = (nq - q0).min(kernels::MAX_VALUE_ROWS);
                    // SAFETY: each (row, head) output slice is written by exactly one unit,
                    // and the queries of a unit are distinct (row, head) pairs.
                    let mut ys: [&mut [f32]; kernels::MAX_VALUE_ROWS] = std::array::from_fn(|j| {
                        let qi = (q0 + j).min(nq - 1);
                        let (i, h) = (qrow(qi), h0 + qi % k);
                        unsafe { std::slice::from_raw_parts_mut(out_ptr.0.add(i * nh * hd + h * hd), if j < m { hd } else { 0 }) }
                    });
                    for y in &mut ys[..m] {
                        y.fill(0.0);
                    }
                    match layer {
                        KvLayer::F16 { v: vc, .. } => {
                            // All the runs of slots in one call: the sums stay in registers.
                            let ws: [&[f32]; kernels::MAX_VALUE_ROWS] = std::array::from_fn(|j| {
                                let qi = (q0 + j).min(nq - 1);
                                &s[qi * ostride + first - c0..(qi + 1) * ostride]
                            });
                            kernels::values_f16_runs(&ws[..m], vc, kv_out, g * hd, vruns, &mut ys[..m]);
                        }
                        KvLayer::Q8 { v: vc, vs, .. } => {
                            // One call a run; `t` is the run's first position.
                            let mut t = first;
                            for &(sl, l) in vruns.iter() {
                                let ws: [&[f32]; kernels::MAX_VALUE_ROWS] = std::array::from_fn(|j| {
                                    let qi = (q0 + j).min(nq - 1);
                                    &s[qi * ostride + t - c0..(qi + 1) * ostride]
                                });
                                kernels::values_q8(&ws[..m], vc, vs, kv_out, ngr, g * hd, g * hd / G, sl, sl + l, &mut ys[..m]);
                                t += l;
                            }
                        }
                    }
                }
            }
        })
    };
    // Threads only pay when there is enough work.
    let total_keys: usize = segs
        .iter()
        .map(|sg| (0..sg.n).map(|i| sg.start + i + 1 - lo(sg.start + i)).sum::<usize>())
        .sum::<usize>()
        * nh;
    if total_keys * hd < 32 * 1024 || units == 1 {
        work(0, units);
    } else {
        let per = units.div_ceil(pool::pool().threads() * 4).max(1);
        pool::pool().run_chunks(units.div_ceil(per), &|c| work(c * per, ((c + 1) * per).min(units)));
    }
}
