//! `cargo xtask convert kokoro-onnx-to-safetensors`.

use anyhow::{bail, Context, Result};
use sapient_kokoro::onnx_import::{convert_to_safetensors, ImportReport};
use sapient_kokoro::KokoroConfig;
use std::path::{Path, PathBuf};

const ONNX_NAME: &str = "kokoro-v1.0.int8.onnx";

pub fn onnx_to_safetensors(input: &str, out_dir: &Path, dtype: &str, report: Option<&Path>) -> Result<()> {
    let dtype = match dtype {
        "f32" => candle_core::DType::F32,
        "f16" => candle_core::DType::F16,
        "bf16" => candle_core::DType::BF16,
        other => bail!("--dtype {other}: expected f32, f16 or bf16"),
    };
    let path = Path::new(input);
    let (onnx, dir): (PathBuf, PathBuf) = if path.is_file() {
        (path.to_path_buf(), path.parent().map(Path::to_path_buf).unwrap_or_default())
    } else if path.is_dir() {
        (path.join(ONNX_NAME), path.to_path_buf())
    } else {
        let m = sapient_hub::Hub::new()?
            .resolve(input, &mut |_| {})
            .with_context(|| format!("'{input}' is neither a file, a directory nor a preset"))?;
        (m.file("onnx")?.to_path_buf(), m.dir.clone())
    };
    let mut cfg = KokoroConfig::v1_0();
    let vocab = dir.join("vocab.json");
    if vocab.is_file() {
        cfg.vocab = read_vocab(&vocab)?;
        cfg.validate(&vocab)?;
    } else {
        eprintln!("note: no vocab.json beside {}; config.json gets an empty vocabulary", onnx.display());
    }
    let rep = convert_to_safetensors(&onnx, &cfg, out_dir, dtype).with_context(|| format!("converting {}", onnx.display()))?;
    println!(
        "wrote {} tensors ({} parameters, {dtype:?}) and config.json to {}",
        rep.mapped.len(),
        rep.param_count(),
        out_dir.display()
    );
    println!(
        "graph initializers: {} mapped sources, {} scales/zero points, {} non-parameter float constants, {} integer constants; absent (unused by inference): {}",
        rep.mapped.iter().flat_map(|m| m.sources.first()).collect::<std::collections::HashSet<_>>().len(),
        rep.quant_params.len(),
        rep.constants.len(),
        rep.int_constants.len(),
        if rep.absent_optional.is_empty() { "none".to_string() } else { rep.absent_optional.join(", ") }
    );
    if let Some(p) = report {
        std::fs::write(p, serde_json::to_string_pretty(&report_json(&rep))?).with_context(|| format!("writing {}", p.display()))?;
        println!("report: {}", p.display());
    }
    Ok(())
}

/// `vocab.json`: `{"vocab": {phoneme: id}}` (kokoro-onnx) or a bare `{phoneme: id}` map.
fn read_vocab(path: &Path) -> Result<std::collections::BTreeMap<String, u32>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let map = v.get("vocab").unwrap_or(&v);
    serde_json::from_value(map.clone()).with_context(|| format!("{}: expected {{phoneme: id}}", path.display()))
}

fn report_json(r: &ImportReport) -> serde_json::Value {
    serde_json::json!({
        "param_count": r.param_count(),
        "mapped": r.mapped.iter().map(|m| serde_json::json!({
            "name": m.name, "shape": m.shape, "how": m.how, "sources": m.sources,
        })).collect::<Vec<_>>(),
        "quant_params": r.quant_params,
        "constants": r.constants.iter().map(|(n, why)| serde_json::json!({"name": n, "why": why})).collect::<Vec<_>>(),
        "int_constants": r.int_constants,
        "absent_optional": r.absent_optional,
    })
}
