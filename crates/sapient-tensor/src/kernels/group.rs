//! Several products of one input in one dispatch ([`matmul_group`], [`matmul_group_prep`]).

use super::*;

/// Most matrices [`matmul_group`] takes.
pub const MAX_GROUP: usize = 4;

/// Several products of the same input in one dispatch on the kernel pool (the q, k and v
/// projections, or gate and up): `outs[i] = x @ mats[i]^T`, `[m, mats[i].rows()]` each.
/// The input is quantized once per activation format the matrices need, and the results are
/// exactly those of separate [`QMatrix::matmul`] calls.
pub fn matmul_group(mats: &[&QMatrix], x: &[f32], m: usize, outs: &mut [&mut [f32]]) {
    group(mats, ActsIn::Ready(x), m, outs)
}

/// Fills a range of rows of a product's input (`rows` starts at the range's first row)
/// before they are quantized; see [`matmul_group_prep`].
pub type Prep<'a> = &'a (dyn Fn(std::ops::Range<usize>, &mut [f32]) + Sync);

/// [`matmul_group`] whose input rows are first made by `prep` (`prep(r, rows)` writes rows
/// `r` of `x`, `rows` being `x[r.start * cols..r.end * cols]`; a residual add and RMSNorm,
/// the gated activation), in the same pool job as their quantization: each row range is
/// prepared and quantized by one thread, so the preparation costs no dispatch of its own
/// and runs on all threads. Rows must not depend on one another. The results are those of
/// `prep(0..m, x)` followed by [`matmul_group`].
pub fn matmul_group_prep(mats: &[&QMatrix], x: &mut [f32], m: usize, outs: &mut [&mut [f32]], prep: Prep<'_>) {
    group(mats, ActsIn::Prep(x, prep), m, outs)
}

/// A product's input: ready, or to be made row range by row range ([`matmul_group_prep`]).
pub(super) enum ActsIn<'a, 'p> {
    Ready(&'a [f32]),
    Prep(&'a mut [f32], Prep<'p>),
}

pub(super) fn group(mats: &[&QMatrix], xin: ActsIn<'_, '_>, m: usize, outs: &mut [&mut [f32]]) {
    assert!(!mats.is_empty() && mats.len() <= MAX_GROUP, "matmul_group takes 1 to {MAX_GROUP} matrices");
    assert_eq!(mats.len(), outs.len(), "matmul_group: one output per matrix");
    let cols = mats[0].cols;
    // The first quantization prepares the rows (`pending`); the others read them (`x`).
    let (mut x, mut pending): (&[f32], _) = match xin {
        ActsIn::Ready(x) => (x, None),
        ActsIn::Prep(x, prep) => (&[], Some((x, prep))),
    };
    assert_eq!(pending.as_ref().map_or(x.len(), |p| p.0.len()), m * cols, "matmul_group: x has the wrong length");
    // Activations: one quantization per distinct format key.
    let mut acts: [Option<QuantizedActs>; MAX_GROUP] = Default::default();
    let mut which = [0usize; MAX_GROUP];
    let mut bytes: [std::borrow::Cow<'_, [u8]>; MAX_GROUP] = Default::default();
    let mut ptrs: [SendPtr; MAX_GROUP] = std::array::from_fn(|_| SendPtr(std::ptr::null_mut()));
    let mut first = [0usize; MAX_GROUP + 1];
    let mut chunk = [0usize; MAX_GROUP];
    let mut work = 0;
    for (i, (w, out)) in mats.iter().zip(outs.iter_mut()).enumerate() {
        assert_eq!(w.cols, cols, "matmul_group: matrices of different widths");
        assert_eq!(out.len(), m * w.rows, "matmul_group: out has the wrong length");
        which[i] = match acts.iter().position(|a| a.as_ref().is_some_and(|a| a.fits(w))) {
            Some(k) => k,
            None => {
                let k = acts.iter().position(Option::is_none).unwrap_or(0);
                acts[k] = Some(match pending.take() {
                    Some((xm, prep)) => {
                        let a = QuantizedActs::for_matrix_prep(w, xm, m, prep);
                        x = xm;
                        a
                    }
                    None => QuantizedActs::for_matrix(w, x, m),
                });
                k
            }
        };
        bytes[i] = match &acts[which[i]] {
            Some(a) => w.bytes_for(a),
            None => Default::default(),
        };
        ptrs[i] = SendPtr(out.as_mut_ptr());
        chunk[i] = chunk_len(w.rows, m);
        first[i + 1] = first[i] + w.rows.div_ceil(chunk[i]);
        work += w.rows * m * cols;
    }
    let n = mats.len();
    let job = |c: usize| {
        let mut i = 0;
        while c >= first[i + 1] {
            i += 1;
        }
        let r0 = (c - first[i]) * chunk[i];
        let range = r0..(r0 + chunk[i]).min(mats[i].rows);
        if let Some(a) = &acts[which[i]] {
            mats[i].product_rows(&bytes[i], a, &ptrs[i], range);
        }
    };
    run_chunks(first[n], work, &job);
}
