use super::*;
use std::ops::Range;

fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Attention in f64, one sequence and head at a time.
fn reference(qkv: &[f32], seqs: &[Range<usize>], heads: usize, hd: usize, scale: f32) -> Vec<f32> {
    let d = heads * hd;
    let rows = seqs.iter().map(|s| s.end).max().unwrap_or(0);
    let mut out = vec![0f32; rows * d];
    for s in seqs {
        for h in 0..heads {
            for i in s.clone() {
                let q = &qkv[i * 3 * d + h * hd..][..hd];
                let sc: Vec<f64> = s.clone().map(|j| q.iter().zip(&qkv[j * 3 * d + d + h * hd..][..hd]).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * scale as f64).collect();
                let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = sc.iter().map(|v| (v - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for c in 0..hd {
                    let v: f64 = s.clone().zip(&e).map(|(j, p)| p * qkv[j * 3 * d + 2 * d + h * hd + c] as f64).sum();
                    out[i * d + h * hd + c] = (v / z) as f32;
                }
            }
        }
    }
    out
}

#[test]
fn self_attention_matches_f64_short_long_and_packed() {
    // (heads, head dim, sequences): short packed sentences, a long sequence per kernel
    // (heads of 64 take the fused kernel where it runs, 32 the blocked one), and a mix.
    let cases: Vec<(usize, usize, Vec<Range<usize>>)> = vec![
        (4, 32, vec![0..7, 7..30, 30..31, 31..64]),
        (2, 64, vec![0..300, 300..300]),
        (3, 32, vec![0..5, 5..260, 260..290]),
        (2, 16, vec![0..40, 40..40, 40..41]),
    ];
    for (k, (heads, hd, seqs)) in cases.into_iter().enumerate() {
        let rows = seqs.iter().map(|s| s.end).max().unwrap_or(0);
        let qkv = noise(rows * 3 * heads * hd, k as u64 + 1).iter().map(|v| v * 3.0).collect::<Vec<_>>();
        let scale = 1.0 / (hd as f32).sqrt();
        let want = reference(&qkv, &seqs, heads, hd, scale);
        let mut got = vec![f32::NAN; rows * heads * hd];
        self_attention(&qkv, &seqs, heads, hd, scale, &mut got, &mut AttentionScratch::default());
        // bf16 products (AMX) carry about 3 significant digits; f32 paths far more
        let tol = if kernels_amx() { 2e-2 } else { 2e-5 };
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!((a - b).abs() <= tol, "case {k}: value {i}: {a} vs {b}");
        }
    }
}

fn kernels_amx() -> bool {
    crate::kernels::has_amx_bf16()
}

#[test]
fn sequences_attend_only_to_themselves() {
    // a sequence's output does not depend on what is packed beside it
    let (heads, hd) = (2, 32);
    let d = heads * hd;
    let qkv = noise(50 * 3 * d, 9);
    let mut alone = vec![0f32; 20 * d];
    self_attention(&qkv[10 * 3 * d..30 * 3 * d], std::slice::from_ref(&(0..20)), heads, hd, 0.2, &mut alone, &mut AttentionScratch::default());
    let mut packed = vec![0f32; 50 * d];
    self_attention(&qkv, &[0..10, 10..30, 30..50], heads, hd, 0.2, &mut packed, &mut AttentionScratch::default());
    assert_eq!(alone, packed[10 * d..30 * d]);
}

fn norm_f64(x: &[f32], w: &[f32], b: &[f32], eps: f32) -> Vec<f32> {
    let n = x.len() as f64;
    let m = x.iter().map(|&v| v as f64).sum::<f64>() / n;
    let var = x.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / n;
    x.iter().enumerate().map(|(i, &v)| (((v as f64 - m) / (var + eps as f64).sqrt()) as f32) * w[i] + b[i]).collect()
}

#[test]
fn layer_norm_forms_agree_with_f64() {
    for d in [16usize, 24, 384, 100] {
        let rows = 3000 / d + 40; // enough values to go over the pool
        let x: Vec<f32> = noise(rows * d, d as u64).iter().enumerate().map(|(i, v)| v * 50.0 + (i % 7) as f32 * 1000.0).collect();
        let y = noise(rows * d, 77);
        let (w, b) = (noise(d, 3), noise(d, 4));
        let ln = LayerNorm::new(w.clone(), b.clone(), 1e-5).unwrap();
        let mut want = Vec::new();
        for r in x.chunks_exact(d) {
            want.extend(norm_f64(r, &w, &b, 1e-5));
        }
        let mut inplace = x.clone();
        ln.rows(&mut inplace);
        let mut to = vec![0f32; x.len()];
        ln.rows_to(&x, &mut to);
        assert_eq!(inplace, to, "d={d}");
        for (a, e) in inplace.iter().zip(&want) {
            assert!((a - e).abs() <= 1e-5 * e.abs().max(1.0), "d={d}: {a} vs {e}");
        }
        let mut added = x.clone();
        ln.add_rows(&mut added, &y);
        let mut sum: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
        ln.rows(&mut sum);
        assert_eq!(added, sum, "d={d}");
        let mut one = x[..d].to_vec();
        layer_norm(&mut one, &w, &b, 1e-5);
        assert_eq!(one, inplace[..d]);
    }
}

#[test]
fn layer_norm_refuses_mismatched_weights() {
    let e = LayerNorm::new(vec![1.0; 4], vec![0.0; 3], 1e-5).unwrap_err().to_string();
    assert!(e.contains('4') && e.contains('3'), "{e}");
    assert!(LayerNorm::new(Vec::new(), Vec::new(), 1e-5).is_err());
}
