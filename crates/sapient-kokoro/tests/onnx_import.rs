//! The Kokoro int8 ONNX import on the real file (fetched through the hub on first use):
//! every graph weight accounted for, the parameter count of Kokoro-82M, dequantized values
//! equal to onnxruntime's DequantizeLinear (tests/data/kokoro/onnx_reference.json, written by
//! scripts/kokoro/onnx_reference.py), an LSTM in PyTorch's gate order over the imported
//! weights against onnxruntime's DynamicQuantizeLSTM on the same file, and the safetensors
//! round trip through `KokoroWeights`.

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use sapient_kokoro::onnx_import::{import, Imported};
use sapient_kokoro::params::expected_params;
use sapient_kokoro::{KokoroConfig, KokoroWeights};
use sapient_tensor::onnx::OnnxModel;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::OnceLock;

fn preset_dir() -> Result<(PathBuf, PathBuf)> {
    let r = sapient_hub::Hub::new()?.fetch_preset("kokoro-82m", &mut |_| {})?;
    Ok((r.file("onnx")?.to_path_buf(), r.file("vocab")?.to_path_buf()))
}

/// The import is done once for all tests of this file.
fn imported() -> &'static (OnnxModel, Imported) {
    static CELL: OnceLock<(OnnxModel, Imported)> = OnceLock::new();
    CELL.get_or_init(|| {
        let (onnx, _) = preset_dir().expect("fetching kokoro-82m");
        let m = OnnxModel::open(&onnx).expect("opening the ONNX file");
        let i = import(&m, &KokoroConfig::v1_0()).expect("importing");
        (m, i)
    })
}

fn reference() -> Result<serde_json::Value> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/kokoro/onnx_reference.json");
    Ok(serde_json::from_str(&std::fs::read_to_string(&p).with_context(|| p.display().to_string())?)?)
}

#[test]
fn every_weight_is_accounted_for() -> Result<()> {
    let (model, imp) = imported();
    let r = &imp.report;
    let cfg = KokoroConfig::v1_0();
    let specs = expected_params(&cfg);
    let needed: Vec<_> = specs.iter().filter(|s| !s.optional).collect();
    let derived = r.constants.iter().filter(|(_, why)| why.starts_with("1/")).count();
    eprintln!(
        "tensors {} params {} constants {} derived {} quant {} int {}",
        imp.tensors.len(),
        r.param_count(),
        r.constants.len(),
        derived,
        r.quant_params.len(),
        r.int_constants.len()
    );
    // every inference parameter of KModel, nothing else
    assert_eq!(imp.tensors.len(), needed.len());
    assert_eq!(imp.tensors.len(), 457);
    for s in &needed {
        assert_eq!(imp.tensors[&s.name].dims(), s.shape.as_slice(), "{}", s.name);
    }
    assert_eq!(r.absent_optional, ["bert.pooler.weight", "bert.pooler.bias"]);
    // Kokoro-82M: 81.7M parameters with the (unused) 0.6M pooler
    let params = r.param_count();
    let pooler = 768 * 768 + 768;
    assert_eq!(params, needed.iter().map(|s| s.shape.iter().product::<usize>()).sum::<usize>());
    assert_eq!(params, 81_140_664);
    assert!((80_000_000..84_000_000).contains(&(params + pooler)), "{params}");
    // ... and exactly the values of the weight initializers they come from (each weight
    // initializer counted once, however many ops read it)
    let init_count: HashMap<&str, usize> = model.graph.initializers.iter().map(|t| (t.name.as_str(), t.elem_count())).collect();
    let primary: HashSet<&str> = r.mapped.iter().map(|m| m.sources[0].as_str()).collect();
    assert_eq!(primary.iter().map(|s| init_count[s]).sum::<usize>(), params);

    // every initializer of the graph: the source of a parameter, the scale / zero point of
    // one, a non-parameter constant (with a reason), or an integer constant
    let mut seen: HashSet<&str> = HashSet::new();
    for m in &r.mapped {
        seen.extend(m.sources.iter().map(String::as_str));
    }
    seen.extend(r.quant_params.iter().map(String::as_str));
    seen.extend(r.constants.iter().map(|(n, _)| n.as_str()));
    seen.extend(r.int_constants.iter().map(String::as_str));
    let all: HashSet<&str> = model.graph.initializers.iter().map(|t| t.name.as_str()).collect();
    let unaccounted: Vec<_> = all.difference(&seen).collect();
    assert!(unaccounted.is_empty(), "{unaccounted:?}");
    assert_eq!(all.len(), 775);

    // the non-parameter float constants are few and small, or derived
    // 1/alpha of the Snake alphas: 8 AdaINResBlock1 (noise_res.0-1, resblocks.0-5) x 6
    assert_eq!(derived, 48);
    assert_eq!((r.constants.len(), r.quant_params.len(), r.int_constants.len()), (74, 230, 44));
    for (name, why) in &r.constants {
        let t = model.graph.initializers.iter().find(|t| &t.name == name).unwrap();
        assert!(
            t.elem_count() <= 32 || why.starts_with("fill") || why.starts_with("1/") || why.starts_with("STFT"),
            "{name}: {why}"
        );
    }
    // how each parameter was found
    let count = |how: &str| r.mapped.iter().filter(|m| m.how == how).count();
    assert_eq!(count("DynamicQuantizeLSTM"), 6 * 8);
    assert_eq!(count("DequantizeLinear"), 4);
    Ok(())
}

fn to_vec(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// Dequantized values equal onnxruntime's DequantizeLinear (exactly: both compute
/// `(q - zp) * scale` in f32) after the documented layout changes.
#[test]
fn dequantized_values_match_onnxruntime() -> Result<()> {
    let (_, imp) = imported();
    let reference = reference()?;
    let tensors = reference["tensors"].as_object().context("tensors")?;
    let mut checked = 0;
    for (name, want) in tensors {
        if name.starts_with("__") {
            continue;
        }
        let t = imp.tensors.get(name).with_context(|| format!("'{name}' not imported"))?;
        let shape: Vec<usize> = serde_json::from_value(want["shape"].clone())?;
        assert_eq!(t.dims(), shape.as_slice(), "{name}");
        let v = to_vec(t);
        for s in want["samples"].as_array().context("samples")? {
            let (i, x) = (s[0].as_u64().context("index")? as usize, s[1].as_f64().context("value")? as f32);
            assert_eq!(v[i].to_bits(), x.to_bits(), "{name}[{i}]: {} vs onnxruntime {x}", v[i]);
        }
        let sum: f64 = v.iter().map(|&x| x as f64).sum();
        let sum_sq: f64 = v.iter().map(|&x| (x as f64).powi(2)).sum();
        let (ws, wq) = (want["sum"].as_f64().context("sum")?, want["sum_sq"].as_f64().context("sum_sq")?);
        assert!((sum - ws).abs() <= 1e-9 * wq.sqrt() * (v.len() as f64).sqrt() + 1e-6, "{name}: sum {sum} vs {ws}");
        assert!((sum_sq - wq).abs() <= 1e-9 * wq, "{name}: sum of squares {sum_sq} vs {wq}");
        checked += 1;
    }
    assert_eq!(checked, 15);
    Ok(())
}

/// One direction of a PyTorch LSTM (gates i, f, g, o) over `x` [T][input].
fn lstm_dir(x: &[Vec<f32>], wih: &[f32], whh: &[f32], bih: &[f32], bhh: &[f32], h: usize, reverse: bool) -> Vec<Vec<f64>> {
    let input = x[0].len();
    let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
    let (mut hs, mut cs) = (vec![0f64; h], vec![0f64; h]);
    let mut out = vec![Vec::new(); x.len()];
    let order: Vec<usize> = if reverse { (0..x.len()).rev().collect() } else { (0..x.len()).collect() };
    for t in order {
        let mut z = vec![0f64; 4 * h];
        for (r, zr) in z.iter_mut().enumerate() {
            let mut acc = bih[r] as f64 + bhh[r] as f64;
            for k in 0..input {
                acc += wih[r * input + k] as f64 * x[t][k] as f64;
            }
            for k in 0..h {
                acc += whh[r * h + k] as f64 * hs[k];
            }
            *zr = acc;
        }
        for j in 0..h {
            let (i, f, g, o) = (sig(z[j]), sig(z[h + j]), z[2 * h + j].tanh(), sig(z[3 * h + j]));
            cs[j] = f * cs[j] + i * g;
            hs[j] = o * cs[j].tanh();
        }
        out[t] = hs.clone();
    }
    out
}

/// `predictor.shared` run as a PyTorch LSTM over the imported weights matches onnxruntime's
/// DynamicQuantizeLSTM on the file's quantized weights (which also quantizes the
/// activations: the float reference differs from it by 0.0095 at most), and the same LSTM
/// with ONNX's gate order (no reordering) does not.
#[test]
fn lstm_layout_matches_onnxruntime() -> Result<()> {
    let (_, imp) = imported();
    let reference = reference()?;
    let want = &reference["tensors"]["__lstm_predictor.shared"];
    let (t_len, input, h) = (want["T"].as_u64().unwrap() as usize, want["input_size"].as_u64().unwrap() as usize, 256);
    let y: Vec<f64> = serde_json::from_value(want["y"].clone())?; // [T, 2, 1, H]
    let x: Vec<Vec<f32>> = (0..t_len)
        .map(|t| (0..input).map(|k| (0.37 * (t * input + k) as f64).sin() as f32).collect())
        .collect();
    let p = |n: &str| to_vec(&imp.tensors[&format!("predictor.shared.{n}")]);
    let run = |reorder: bool| -> f64 {
        let mut worst = 0f64;
        for (d, sfx) in ["", "_reverse"].iter().enumerate() {
            let mut w = [p(&format!("weight_ih_l0{sfx}")), p(&format!("weight_hh_l0{sfx}")), p(&format!("bias_ih_l0{sfx}")), p(&format!("bias_hh_l0{sfx}"))];
            if !reorder {
                // back to ONNX's i, o, f, c: what an importer that forgot the gates would give
                for m in &mut w {
                    let block = m.len() / 4;
                    let b: Vec<Vec<f32>> = m.chunks(block).map(<[f32]>::to_vec).collect();
                    *m = [b[0].clone(), b[3].clone(), b[1].clone(), b[2].clone()].concat();
                }
            }
            let out = lstm_dir(&x, &w[0], &w[1], &w[2], &w[3], h, d == 1);
            for (t, row) in out.iter().enumerate() {
                for (j, v) in row.iter().enumerate() {
                    worst = worst.max((v - y[(t * 2 + d) * h + j]).abs());
                }
            }
        }
        worst
    };
    let ok = run(true);
    assert!(ok < 0.02, "PyTorch-order LSTM vs onnxruntime: max |diff| {ok}");
    let wrong = run(false);
    assert!(wrong > 0.1, "the check does not tell gate orders apart ({wrong})");
    eprintln!("LSTM vs onnxruntime: max |diff| {ok:.4} (ONNX gate order: {wrong:.3})");
    Ok(())
}

/// `convert_to_safetensors` then `KokoroWeights::load`: same tensors, and the config with its
/// vocabulary reads back. A checkpoint in PyTorch form (weight-normed convs as
/// `weight_g`/`weight_v`, `module.` after the top-level name) loads to the same weights.
#[test]
fn safetensors_round_trip_and_pytorch_form() -> Result<()> {
    let (onnx, vocab) = preset_dir()?;
    let (_, imp) = imported();
    let mut cfg = KokoroConfig::v1_0();
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&vocab)?)?;
    cfg.vocab = serde_json::from_value(v["vocab"].clone())?;
    assert!(cfg.vocab.len() > 100);
    let dir = tempfile::tempdir()?;
    let report = sapient_kokoro::onnx_import::convert_to_safetensors(&onnx, &cfg, dir.path(), DType::F32)?;
    assert_eq!(report.mapped.len(), imp.tensors.len());
    let back = KokoroConfig::from_file(&dir.path().join("config.json"))?;
    assert_eq!(back, cfg);

    let src = sapient_tensor::SafetensorsFiles::open(&[dir.path().join("model.safetensors")])?;
    let w = KokoroWeights::load(&src, &cfg, &Device::Cpu, DType::F32)?;
    assert_eq!(w.len(), imp.tensors.len());
    assert_eq!(w.param_count(), imp.report.param_count());
    for name in ["decoder.generator.ups.0.weight", "predictor.shared.weight_ih_l0", "bert.embeddings.word_embeddings.weight"] {
        assert_eq!(to_vec(&w.get(name)?), to_vec(&imp.tensors[name]), "{name}");
    }

    // the PyTorch form of a few tensors
    let mut map: HashMap<String, Tensor> = imp.tensors.iter().map(|(k, t)| (k.clone(), t.clone())).collect();
    let conv = "decoder.generator.resblocks.2.convs1.1";
    let wt = map.remove(&format!("{conv}.weight")).unwrap();
    let g = wt.sqr()?.sum_keepdim((1, 2))?.sqrt()?; // ||w|| per output channel
    let scaled_v = (&wt * 3.0)?; // any positive multiple of w folds back to w
    map.insert(format!("{conv}.weight_g"), g);
    map.insert(format!("{conv}.weight_v"), scaled_v);
    let emb = map.remove("bert.embeddings.word_embeddings.weight").unwrap();
    map.insert("bert.module.embeddings.word_embeddings.weight".into(), emb);
    let pt = dir.path().join("pytorch_form.safetensors");
    candle_core::safetensors::save(&map, &pt)?;
    let w2 = KokoroWeights::load(&sapient_tensor::SafetensorsFiles::open(&[&pt])?, &cfg, &Device::Cpu, DType::F32)?;
    let (a, b) = (to_vec(&w2.get(&format!("{conv}.weight"))?), to_vec(&imp.tensors[&format!("{conv}.weight")]));
    let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs() / y.abs().max(1e-3)).fold(0f32, f32::max);
    assert!(worst < 1e-5, "weight norm fold: relative error {worst}");
    assert_eq!(to_vec(&w2.get("bert.embeddings.word_embeddings.weight")?), to_vec(&imp.tensors["bert.embeddings.word_embeddings.weight"]));

    // a missing and a mis-shaped parameter are errors that name them
    map.remove("predictor.N_proj.bias");
    map.insert("text_encoder.cnn.0.1.gamma".into(), Tensor::zeros(511, DType::F32, &Device::Cpu)?);
    let bad = dir.path().join("bad.safetensors");
    candle_core::safetensors::save(&map, &bad)?;
    let e = KokoroWeights::load(&sapient_tensor::SafetensorsFiles::open(&[&bad])?, &cfg, &Device::Cpu, DType::F32).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("missing 'predictor.N_proj.bias'"), "{msg}");
    assert!(msg.contains("text_encoder.cnn.0.1.gamma") && msg.contains("[511]"), "{msg}");
    assert!(msg.contains("2 problem(s)"), "{msg}");
    Ok(())
}

/// What the import refuses: a float tensor it cannot place, a PyTorch name that is no
/// parameter, a quantized weight no known op reads, an op in an unknown module, and a config
/// the graph does not fit. Each error names the tensor or node.
#[test]
fn unplaceable_weights_are_errors() -> Result<()> {
    let (onnx, _) = preset_dir()?;
    let cfg = KokoroConfig::v1_0();
    let fresh = || OnnxModel::open(&onnx).expect("opening");
    let find = |m: &OnnxModel, n: &str| m.graph.initializers.iter().find(|t| t.name == n).cloned().unwrap();

    let mut m = fresh();
    let mut t = find(&m, "/decoder/decoder/generator/Mul_output_0");
    t.name = "/decoder/extra_output_0".into();
    m.graph.initializers.push(t);
    let e = import(&m, &cfg).err().context("an extra float tensor was accepted")?.to_string();
    assert!(e.contains("'/decoder/extra_output_0'") && e.contains("no parameter this importer can place"), "{e}");

    let mut m = fresh();
    let mut t = find(&m, "encoder.text_encoder.cnn.0.1.gamma");
    t.name = "encoder.text_encoder.cnn.0.1.delta".into();
    m.graph.initializers.push(t);
    let e = import(&m, &cfg).err().context("an unknown PyTorch name was accepted")?.to_string();
    assert!(e.contains("'text_encoder.cnn.0.1.delta') that is no Kokoro parameter"), "{e}");

    let mut m = fresh();
    m.graph.nodes.retain(|n| n.name != "/encoder/shared/LSTM_quant");
    let e = import(&m, &cfg).err().context("an unread quantized weight was accepted")?.to_string();
    assert!(e.contains("onnx::LSTM_698") && e.contains("consumed by no op"), "{e}");

    let mut m = fresh();
    let node = m.graph.nodes.iter_mut().find(|n| n.name == "/encoder/F0.1/conv1x1/Conv_quant").unwrap();
    node.name = "/encoder/F0.1/conv9x9/Conv_quant".into();
    let e = import(&m, &cfg).err().context("an unknown module was accepted")?.to_string();
    assert!(e.contains("scope 'F0.1.conv9x9' is no module of Kokoro"), "{e}");

    let m = fresh();
    let mut small = cfg.clone();
    small.n_token = 100;
    let e = import(&m, &small).err().context("a config that does not fit was accepted")?.to_string();
    assert!(e.contains("'bert.embeddings.word_embeddings.weight' has shape [178, 128], the config gives [100, 128]"), "{e}");
    Ok(())
}
