//! CTranslate2 import: the real tiny.en file, its split projections checked against the raw
//! fused data, conversion to transformers safetensors and back into the model, and clear
//! errors on truncated or corrupt files.

mod common;
use anyhow::Result;
use candle_core::{DType, Device, IndexOp, Tensor};
use common::*;
use sapient_whisper::ct2::{self, Ct2Model};
use sapient_whisper::{Error, TranscribeOptions, Transcriber, WhisperConfig, WhisperTokenizer};
use std::path::PathBuf;

fn tiny() -> (PathBuf, PathBuf, PathBuf) {
    let m = preset("whisper-tiny.en");
    (
        m.file("model").unwrap().to_path_buf(),
        m.file("config").unwrap().to_path_buf(),
        m.file("tokenizer").unwrap().to_path_buf(),
    )
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    let a = a.to_dtype(DType::F32).unwrap();
    let b = b.to_dtype(DType::F32).unwrap();
    (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap()
}

#[test]
fn tiny_en_dims_and_config() -> Result<()> {
    let (bin, cfg_path, _) = tiny();
    let m = Ct2Model::open(&bin)?;
    assert_eq!((m.version, m.spec.as_str()), (6, "WhisperSpec"));
    let mut cfg = m.dims()?;
    cfg.merge_ct2_config(&cfg_path)?;
    assert_eq!(
        (cfg.vocab_size, cfg.num_mel_bins, cfg.d_model, cfg.encoder_layers, cfg.decoder_layers),
        (51864, 80, 384, 4, 4)
    );
    assert_eq!((cfg.encoder_attention_heads, cfg.decoder_attention_heads, cfg.encoder_ffn_dim), (6, 6, 1536));
    assert_eq!((cfg.max_source_positions, cfg.max_target_positions), (1500, 448));
    assert!(!cfg.is_multilingual());
    // from the CTranslate2 config.json
    let raw: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cfg_path)?)?;
    assert_eq!(cfg.alignment_heads.len(), raw["alignment_heads"].as_array().unwrap().len());
    assert_eq!(cfg.alignment_heads[0], (1, 0));
    assert_eq!(cfg.begin_suppress_tokens, vec![220, 50256]);
    assert_eq!(cfg.suppress_tokens.len(), raw["suppress_ids"].as_array().unwrap().len());
    assert_eq!(cfg.lang_ids.len(), 98);
    Ok(())
}

#[test]
fn split_projections_match_the_fused_data() -> Result<()> {
    let (bin, _, _) = tiny();
    let m = Ct2Model::open(&bin)?;
    let cfg = m.dims()?;
    let tensors = m.to_hf_tensors(&cfg)?;
    let get = |n: &str| tensors.iter().find(|t| t.0 == n).map(|t| t.1.clone()).unwrap_or_else(|| panic!("no {n}"));
    // 2 convs (w, b) + positions, per encoder layer 2 LN + q/k/v/o (7) + 2 fc (4) = 15,
    // final LN 2; decoder: embeddings + positions, per layer 3 LN + 2 x 7 attention + 4 fc = 24, LN 2
    assert_eq!(tensors.len(), 5 + 4 * 15 + 2 + 2 + 4 * 24 + 2);
    assert!(tensors.iter().all(|t| !t.0.ends_with("k_proj.bias")), "Whisper keys have no bias");
    let d = 384;
    for layer in [0usize, 3] {
        let fused = m.tensor(&format!("decoder/layer_{layer}/self_attention/linear_0/weight"), &[3 * d, d])?;
        let fb = m.tensor(&format!("decoder/layer_{layer}/self_attention/linear_0/bias"), &[3 * d])?;
        for (k, part) in ["q_proj", "k_proj", "v_proj"].iter().enumerate() {
            let w = get(&format!("model.decoder.layers.{layer}.self_attn.{part}.weight"));
            assert_eq!(w.dims(), &[d, d]);
            assert_eq!(max_diff(&w, &fused.i(k * d..(k + 1) * d)?), 0.0, "{part} of layer {layer}");
        }
        // the key slice of the fused bias is zero; q and v keep theirs
        assert_eq!(max_diff(&fb.i(d..2 * d)?, &Tensor::zeros(d, DType::F16, &Device::Cpu)?), 0.0);
        assert_eq!(max_diff(&get(&format!("model.decoder.layers.{layer}.self_attn.v_proj.bias")), &fb.i(2 * d..)?), 0.0);
        let kv = m.tensor(&format!("decoder/layer_{layer}/attention/linear_1/weight"), &[2 * d, d])?;
        assert_eq!(max_diff(&get(&format!("model.decoder.layers.{layer}.encoder_attn.k_proj.weight")), &kv.i(..d)?), 0.0);
        assert_eq!(max_diff(&get(&format!("model.decoder.layers.{layer}.encoder_attn.v_proj.weight")), &kv.i(d..)?), 0.0);
    }
    // the output projection is an alias of the embedding
    let proj = m.get("decoder/projection/weight").expect("alias");
    assert_eq!(proj.name, "decoder/embeddings/weight");
    Ok(())
}

#[test]
fn converted_safetensors_load_and_transcribe_like_the_ct2_file() -> Result<()> {
    let (bin, cfg_path, tok) = tiny();
    let dir = tempfile::tempdir()?;
    let n = ct2::convert_to_safetensors(&bin, Some(&cfg_path), dir.path(), DType::F16)?;
    assert_eq!(n, 167);
    let cfg = WhisperConfig::from_hf_dir(dir.path())?;
    let mut expected = Ct2Model::open(&bin)?.dims()?;
    expected.merge_ct2_config(&cfg_path)?;
    assert_eq!(cfg, expected, "config.json round trip");
    let hf = Transcriber::from_hf_dir(dir.path(), &tok, &Device::Cpu)?;
    let direct = Transcriber::from_ct2(&bin, Some(&cfg_path), &tok, &Device::Cpu)?;
    let audio = clip("0930");
    let a = hf.transcribe(&audio, &TranscribeOptions::default())?;
    let b = direct.transcribe(&audio, &TranscribeOptions::default())?;
    assert_eq!(a.segments, b.segments);
    let (errors, words) = wer_counts(&reference("0930"), &a.text);
    assert!(errors <= 1, "{errors}/{words} errors: {:?}", a.text);
    Ok(())
}

fn write(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.path().join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn truncated_and_corrupt_files_are_clear_errors() -> Result<()> {
    let (bin, _, _) = tiny();
    let bytes = std::fs::read(&bin)?;
    let dir = tempfile::tempdir()?;
    // cut at several places: header, inside a name, inside the data, before the aliases
    for cut in [0usize, 3, 10, 30, 1000, bytes.len() / 2, bytes.len() - 10] {
        let p = write(&dir, "cut.bin", &bytes[..cut]);
        match Ct2Model::open(&p) {
            Err(Error::Truncated { len, .. }) => assert_eq!(len, cut),
            other => panic!("cut at {cut}: expected Truncated, got {:?}", other.map(|_| ())),
        }
        let msg = Ct2Model::open(&p).unwrap_err().to_string();
        assert!(msg.contains("truncated CTranslate2 file") && msg.contains("cut.bin"), "{msg}");
    }
    // not a CTranslate2 file at all
    let p = write(&dir, "gguf.bin", b"GGUF\x03\x00\x00\x00rest");
    assert!(matches!(Ct2Model::open(&p), Err(Error::Corrupt { .. })));
    // a bad dtype id in the first variable: version, name, revision, count, var name, ndim, dims..
    let mut bad = bytes.clone();
    let name_len = u16::from_le_bytes([bytes[4], bytes[5]]) as usize;
    let first_var = 4 + 2 + name_len + 4 + 4;
    let vlen = u16::from_le_bytes([bytes[first_var], bytes[first_var + 1]]) as usize;
    let ndim_at = first_var + 2 + vlen;
    let dtype_at = ndim_at + 1 + 4 * bytes[ndim_at] as usize;
    bad[dtype_at] = 42;
    let p = write(&dir, "dtype.bin", &bad);
    let e = Ct2Model::open(&p).unwrap_err().to_string();
    assert!(e.contains("unknown dtype id 42"), "{e}");
    // trailing garbage
    let mut long = bytes.clone();
    long.extend_from_slice(b"xyz");
    let p = write(&dir, "long.bin", &long);
    assert!(Ct2Model::open(&p).unwrap_err().to_string().contains("3 trailing bytes"));
    // missing file
    assert!(matches!(Ct2Model::open(&dir.path().join("nope.bin")), Err(Error::Io { .. })));
    Ok(())
}

#[test]
fn tokenizer_of_another_model_is_a_mismatch() -> Result<()> {
    let (bin, cfg_path, _) = tiny();
    let base_tok = preset("whisper-base").file("tokenizer").unwrap().to_path_buf();
    let mut cfg = Ct2Model::open(&bin)?.dims()?;
    cfg.merge_ct2_config(&cfg_path)?;
    let e = WhisperTokenizer::from_file(&base_tok, &cfg).unwrap_err();
    assert!(matches!(e, Error::Mismatch(_)), "{e}");
    assert!(e.to_string().contains("51864"), "{e}");
    // and through the loader
    let e = Transcriber::from_ct2(&bin, Some(&cfg_path), &base_tok, &Device::Cpu).err().expect("mismatch");
    assert!(matches!(e, Error::Mismatch(_)), "{e}");
    Ok(())
}

#[test]
fn non_speech_tokens_equal_the_models_suppress_list() -> Result<()> {
    // openai-whisper's non_speech_tokens computed from the tokenizer, against the list the
    // CTranslate2 converter stored (that list adds the special tokens)
    let (bin, cfg_path, tok) = tiny();
    let mut cfg = Ct2Model::open(&bin)?.dims()?;
    cfg.merge_ct2_config(&cfg_path)?;
    let t = WhisperTokenizer::from_file(&tok, &cfg)?;
    let ours = t.non_speech_tokens()?;
    let specials = [t.sot, t.translate, t.transcribe, t.sot_lm, t.sot_prev, t.no_speech];
    let theirs: Vec<u32> = cfg.suppress_tokens.iter().copied().filter(|x| !specials.contains(x)).collect();
    assert_eq!(ours, theirs);
    assert_eq!((t.eot, t.sot, t.no_timestamps, t.timestamp_begin), (50256, 50257, 50362, 50363));
    Ok(())
}

#[test]
fn q8_0_gguf_loads_to_the_same_model_as_quantizing_at_load() -> Result<()> {
    // ct2 -> model.gguf (matrices Q8_0, the rest f32) + config.json; loaded from the
    // directory, it transcribes as LoadOptions::quantized(Q8_0) on the model.bin does
    let (bin, cfg, tok) = tiny();
    let dir = tempfile::tempdir()?;
    let n = ct2::convert_to_gguf(&bin, Some(&cfg), dir.path(), candle_core::quantized::GgmlDType::Q8_0)?;
    std::fs::copy(&tok, dir.path().join("tokenizer.json"))?;
    let gguf = sapient_tensor::GgufFile::open(dir.path().join("model.gguf"))?;
    assert_eq!(gguf.tensors().len(), n);
    let ty = |name: &str| gguf.tensor_info(name).map(|t| t.ggml_type);
    assert_eq!(ty("model.encoder.layers.0.self_attn.q_proj.weight"), Some(sapient_tensor::GgmlType::Q8_0));
    assert_eq!(ty("model.decoder.layers.3.fc2.weight"), Some(sapient_tensor::GgmlType::Q8_0));
    assert_eq!(ty("model.decoder.embed_tokens.weight"), Some(sapient_tensor::GgmlType::Q8_0));
    assert_eq!(ty("model.encoder.conv1.weight"), Some(sapient_tensor::GgmlType::F32));
    assert_eq!(ty("model.decoder.embed_positions.weight"), Some(sapient_tensor::GgmlType::F32));
    let size = std::fs::metadata(dir.path().join("model.gguf"))?.len();
    let f32_size: u64 = gguf.tensors().iter().map(|t| 4 * t.shape.iter().product::<usize>() as u64).sum();
    eprintln!("model.gguf {size} bytes, {f32_size} in f32");
    // Q8_0 is 34 bytes per 32 values
    assert!(size * 10 < f32_size * 3, "the Q8_0 file is not much smaller: {size} vs {f32_size} in f32");

    let from_gguf = Transcriber::from_pretrained(dir.path().to_str().unwrap())?;
    let q = sapient_whisper::LoadOptions::quantized(candle_core::quantized::GgmlDType::Q8_0);
    let at_load = Transcriber::load_with("whisper-tiny.en", &Device::Cpu, q, &mut |_| {})?;
    let audio = clip("0880");
    let a = from_gguf.transcribe(&audio, &TranscribeOptions::default())?;
    let b = at_load.transcribe(&audio, &TranscribeOptions::default())?;
    assert_eq!(a.segments, b.segments);
    // tiny.en hears "ill-disposed" as "old-sposed" in this clip (f32 too): 2 of 8 words
    let (e, n) = wer_counts(&reference("0880"), &a.text);
    assert!(e <= 2, "{}: {e}/{n}", a.text);
    Ok(())
}
