//! The real voice file of the `kokoro-82m` preset (`voices_ja.npz`, five `[510, 1, 256]`
//! packs) read by `Voices::load`, against values numpy reads from the same file:
//!
//! ```python
//! d = np.load("voices_ja.npz"); a, b = d["jf_alpha"], d["jm_kumo"]
//! a[12, 0, [0, 100, 255]]; (0.6 * a[12, 0] + 0.4 * b[12, 0])[[0, 100, 255]]; a.astype(np.float64).sum()
//! ```

use anyhow::Result;
use sapient_kokoro::Voices;

fn voices() -> Result<Voices> {
    let r = sapient_hub::Hub::new()?.fetch_preset("kokoro-82m", &mut |_| {})?;
    Ok(Voices::load(r.file("voices")?)?)
}

fn close(a: f32, b: f64) -> bool {
    (f64::from(a) - b).abs() < 1e-6
}

#[test]
fn japanese_voices_load_select_and_blend() -> Result<()> {
    let v = voices()?;
    assert_eq!(v.names(), ["jf_alpha", "jf_gongitsune", "jf_nezumi", "jf_tebukuro", "jm_kumo"]);
    let a = v.get("jf_alpha")?;
    assert_eq!((a.rows(), a.dim()), (510, 256));
    let row = a.style_for(12)?;
    for (i, want) in [(0, -0.059496860951185226), (100, -0.0374276302754879), (255, -0.14601486921310425)] {
        assert!(close(row[i], want), "jf_alpha[12][{i}] = {} vs numpy {want}", row[i]);
    }
    let sum: f64 = (0..510).flat_map(|r| a.style_for(r).unwrap().to_vec()).map(f64::from).sum();
    assert!((sum - -1335.385256107933).abs() < 1e-6, "{sum}");
    let blend = v.get("jf_alpha:0.6,jm_kumo:0.4")?;
    let row = blend.style_for(12)?;
    for (i, want) in [(0, -0.08662094175815582), (100, -0.06577432155609131), (255, -0.02181375026702881)] {
        assert!(close(row[i], want), "blend[12][{i}] = {} vs numpy {want}", row[i]);
    }
    let e = v.get("af_heart").unwrap_err().to_string();
    assert!(e.contains("unknown voice 'af_heart'") && e.contains("jm_kumo"), "{e}");
    assert!(a.style_for(510).is_err());
    Ok(())
}

/// The same pack written as a `.npy` and as safetensors (by candle) loads to the same values,
/// named after the file / the tensor.
#[test]
fn npy_and_safetensors_voice_files() -> Result<()> {
    let v = voices()?;
    let a = v.get("jf_alpha")?;
    let rows: Vec<f32> = (0..a.rows()).flat_map(|r| a.style_for(r).unwrap().to_vec()).collect();
    let t = candle_core::Tensor::from_vec(rows, (a.rows(), 1, a.dim()), &candle_core::Device::Cpu)?;
    let dir = tempfile::tempdir()?;
    let npy = dir.path().join("my_voice.npy");
    t.write_npy(&npy)?;
    let st = dir.path().join("voices.safetensors");
    candle_core::safetensors::save(&std::collections::HashMap::from([("jf_alpha".to_string(), t.squeeze(1)?)]), &st)?;
    let from_npy = Voices::load(&npy)?;
    assert_eq!(from_npy.names(), ["my_voice"]);
    let from_st = Voices::load(&st)?;
    assert_eq!(from_st.names(), ["jf_alpha"]);
    for n in [0, 27, 509] {
        assert_eq!(from_npy.get("my_voice")?.style_for(n)?, a.style_for(n)?);
        assert_eq!(from_st.get("jf_alpha")?.style_for(n)?, a.style_for(n)?);
    }
    let bad = dir.path().join("voices.txt");
    std::fs::write(&bad, "x")?;
    assert!(Voices::load(&bad).is_err());
    Ok(())
}

/// PyTorch archives (`tests/data/pt_bare.pt`, `pt_dict.pt`, written by
/// `scripts/kokoro/write_pt_voices.py` in torch.save's layout): a bare tensor is one voice named
/// after the file, a dict gives its names; value `i` of a pack is `base + i / 8`. A truncated
/// archive is an error that names the file.
#[test]
fn pytorch_voice_files() -> Result<()> {
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let want = |base: f32, row: usize| -> Vec<f32> { (0..4).map(|k| base + (row * 4 + k) as f32 / 8.0).collect() };
    let bare = Voices::load(&data.join("pt_bare.pt"))?;
    assert_eq!(bare.names(), ["pt_bare"]);
    let p = bare.get("pt_bare")?;
    assert_eq!((p.rows(), p.dim()), (5, 4));
    for r in 0..5 {
        assert_eq!(p.style_for(r)?, want(0.0, r).as_slice());
    }
    let dict = Voices::load(&data.join("pt_dict.pt"))?;
    assert_eq!(dict.names(), ["af_one", "am_two"]);
    assert_eq!(dict.get("am_two")?.style_for(3)?, want(100.0, 3).as_slice());
    assert_eq!(dict.get("af_one:1,am_two:1")?.style_for(2)?, want(50.0, 2).as_slice());
    let dir = tempfile::tempdir()?;
    let cut = dir.path().join("cut.pt");
    let bytes = std::fs::read(data.join("pt_bare.pt"))?;
    std::fs::write(&cut, &bytes[..bytes.len() / 2])?;
    let e = Voices::load(&cut).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("cut.pt"), "{e}");
    Ok(())
}
