#!/usr/bin/env python3
"""Reference values for sapient-audio's tests, written to tests/data/audio/.

Everything here is computed by the upstream implementations (or a line-by-line numpy
transcription of them, checked against the upstream one where it runs):

* log-mel: OpenAI whisper/audio.py `log_mel_spectrogram` transcribed to numpy in float64
  (torch.stft(center=True, pad_mode="reflect"), periodic Hann window, |X|^2 without the last
  frame, filters from the sdist's mel_filters.npz, log10 clamp, (x + 4) / 4);
* Silero VAD: onnxruntime running silero_vad_16k_op15.onnx window by window exactly as
  silero_vad.utils_vad.OnnxWrapper feeds it (64-sample context, zero-padded last window);
  segments from the package's own get_speech_timestamps_from_probs;
* the package's silero_vad_16k.safetensors is a different checkpoint from its ONNX models
  (upstream issue snakers4/silero-vad#768), so its probabilities come from a numpy
  transcription of the package's tinygrad TinySileroVAD, which is first checked to reproduce
  onnxruntime to 1e-5 when given the ONNX model's weights;
* decoding: libsndfile (soundfile) on the pygame example sounds.

Inputs are the files sapient-hub caches ($SAPIENT_HOME/models/<preset>/, default
~/.cache/sapient); run `cargo xtask fetch silero-vad speech-librivox whisper-assets` (or the
sapient-audio tests, which fetch them and the pygame sounds) first. The silero-vad wheel's
source (for get_speech_timestamps_from_probs) is pip-downloaded unless --silero-src is given.

    python3 -m venv /tmp/refvenv
    /tmp/refvenv/bin/pip install numpy onnxruntime onnx soundfile safetensors
    /tmp/refvenv/bin/python scripts/audio/make_reference.py
"""

import argparse
import ast
import glob
import json
import os
import sys

import numpy as np

HOME = os.environ.get("SAPIENT_HOME") or os.path.expanduser("~/.cache/sapient")
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "audio")
CLIPS = ["0870", "0880", "0890", "0920", "0930"]
# Clips joined by silences of these lengths (samples), to give the segmenter several segments
# and gaps on both sides of its thresholds. The Rust tests build the same signal.
CONCAT = [("0880", 2400), ("0930", 16000), ("0890", 800), ("0920", 0)]


def concat_audio():
    parts = []
    for c, gap in CONCAT:
        parts += [read_wav16(clip_path(c)), np.zeros(gap, np.float32)]
    return np.concatenate(parts)


def model_file(preset, name):
    p = os.path.join(HOME, "models", preset, name)
    if not os.path.exists(p):
        sys.exit(f"missing {p}: fetch the preset '{preset}' first")
    return p


def clip_path(c):
    return model_file("speech-librivox", f"sense_and_sensibility_01_austen_64kb-{c}.wav")


def read_wav16(path):
    import soundfile as sf

    x, sr = sf.read(path, dtype="int16")
    assert sr == 16000 and x.ndim == 1, (path, sr, x.shape)
    # whisper.load_audio: int16 / 32768 as float32
    return x.astype(np.float32) / 32768.0


# ---------------------------------------------------------------- whisper log-mel (numpy)
N_FFT, HOP = 400, 160


def whisper_log_mel(audio, filters, padding=0):
    audio = np.asarray(audio, dtype=np.float32)
    if padding:
        audio = np.pad(audio, (0, padding))
    x = np.pad(audio.astype(np.float64), N_FFT // 2, mode="reflect")  # torch.stft center=True
    n = np.arange(N_FFT)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * n / N_FFT)  # torch.hann_window(400), periodic
    n_frames = 1 + (len(x) - N_FFT) // HOP
    idx = np.arange(N_FFT)[None, :] + HOP * np.arange(n_frames)[:, None]
    stft = np.fft.rfft(x[idx] * window, axis=-1)  # [frames, 201]
    magnitudes = np.abs(stft[:-1]) ** 2  # stft[..., :-1] drops the last frame
    mel_spec = filters.astype(np.float64) @ magnitudes.T  # [n_mels, frames]
    log_spec = np.log10(np.maximum(mel_spec, 1e-10))
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).astype(np.float32)


# ---------------------------------------------------------------- Silero VAD
def ort_probs(onnx_path, wav):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.inter_op_num_threads = 1
    opts.intra_op_num_threads = 1
    s = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"], sess_options=opts)
    state = np.zeros((2, 1, 128), np.float32)
    ctx = np.zeros((1, 64), np.float32)
    out = []
    for i in range(0, len(wav), 512):
        chunk = wav[i : i + 512]
        if len(chunk) < 512:
            chunk = np.pad(chunk, (0, 512 - len(chunk)))
        x = np.concatenate([ctx, chunk[None, :]], axis=1).astype(np.float32)
        o, state = s.run(None, {"input": x, "state": state, "sr": np.array(16000, dtype=np.int64)})
        out.append(float(o.reshape(-1)[0]))
        ctx = x[:, -64:]
    return np.array(out, np.float32)


def conv1d(x, w, b, stride, pad):
    if pad:
        x = np.pad(x, ((0, 0), (pad, pad)))
    _, _, k = w.shape
    t = (x.shape[1] - k) // stride + 1
    cols = np.stack([x[:, i * stride : i * stride + k] for i in range(t)], 0)
    y = np.einsum("tck,ock->ot", cols, w)
    return y + b[:, None] if b is not None else y


def tiny_silero_probs(w, wav):
    """numpy transcription of silero_vad/tinygrad_model.py TinySileroVAD, streamed as in its
    docstring (64-sample context, zero-padded last window)."""
    sig = lambda v: 1 / (1 + np.exp(-v))
    h = np.zeros(128, np.float64)
    c = np.zeros(128, np.float64)
    ctx = np.zeros(64, np.float32)
    out = []
    for i in range(0, len(wav), 512):
        chunk = wav[i : i + 512]
        if len(chunk) < 512:
            chunk = np.pad(chunk, (0, 512 - len(chunk)))
        x = np.concatenate([ctx, chunk]).astype(np.float64)
        ctx = x[-64:].astype(np.float32)
        x = np.pad(x, (0, 64), mode="reflect")[None]
        s = conv1d(x, w["stft_conv.weight"], None, 128, 0)
        m = np.sqrt(s[:129] ** 2 + s[129:] ** 2)
        m = np.maximum(conv1d(m, w["conv1.weight"], w["conv1.bias"], 1, 1), 0)
        m = np.maximum(conv1d(m, w["conv2.weight"], w["conv2.bias"], 2, 1), 0)
        m = np.maximum(conv1d(m, w["conv3.weight"], w["conv3.bias"], 2, 1), 0)
        m = np.maximum(conv1d(m, w["conv4.weight"], w["conv4.bias"], 1, 1), 0)[:, 0]
        g = w["lstm_cell.weight_ih"] @ m + w["lstm_cell.bias_ih"] + w["lstm_cell.weight_hh"] @ h + w["lstm_cell.bias_hh"]
        gi, gf, gg, go = np.split(g, 4)
        c = sig(gf) * c + sig(gi) * np.tanh(gg)
        h = sig(go) * np.tanh(c)
        out.append(float(sig(w["final_conv.weight"][0, :, 0] @ np.maximum(h, 0) + w["final_conv.bias"][0])))
    return np.array(out, np.float32)


def onnx_weights(onnx_path):
    import onnx  # noqa: F401  (only for this check)
    from onnx import numpy_helper

    m = onnx.load(onnx_path)
    init = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in m.graph.initializer}
    w = {
        "stft_conv.weight": init["model.stft.forward_basis_buffer"],
        "final_conv.weight": init["model.decoder.decoder.2.weight"],
        "final_conv.bias": init["model.decoder.decoder.2.bias"],
    }
    for k in range(4):
        for p in ("weight", "bias"):
            w[f"conv{k + 1}.{p}"] = init[f"model.encoder.{k}.reparam_conv.{p}"]
    for p in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
        w[f"lstm_cell.{p}"] = init[f"model.decoder.rnn.{p}"]
    return w


def silero_timestamps_fn(src):
    """get_speech_timestamps_from_probs, taken verbatim from the package source (the module
    itself imports torch, which the function does not need)."""
    path = os.path.join(src, "utils_vad.py")
    tree = ast.parse(open(path).read())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_speech_timestamps_from_probs")
    mod = ast.Module(body=[fn], type_ignores=[])
    ns = {"List": list, "Callable": object, "torch": None, "make_visualization": None}
    exec(compile(mod, path, "exec"), ns)
    return ns["get_speech_timestamps_from_probs"]


def fetch_silero_src():
    import subprocess
    import tempfile
    import zipfile

    d = tempfile.mkdtemp(prefix="silero-src-")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", d, "silero-vad==6.2.3"],
        check=True,
    )
    whl = glob.glob(os.path.join(d, "*.whl"))[0]
    zipfile.ZipFile(whl).extractall(d)
    return os.path.join(d, "silero_vad")


SEGMENT_CASES = {
    "default": {},
    "long_silence": {"min_silence_duration_ms": 300, "min_speech_duration_ms": 500},
    "wide_pad": {"speech_pad_ms": 200},
    "max_speech": {"max_speech_duration_s": 1.5},
    "max_speech_legacy": {"max_speech_duration_s": 1.5, "use_max_poss_sil_at_max_speech": False},
    "high_threshold": {"threshold": 0.8, "neg_threshold": 0.6},
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--silero-src", help="silero_vad package folder (utils_vad.py)")
    ap.add_argument("--pygame-data", help="folder with pygame's example sounds (default: the hub cache)")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)

    # --- mel
    mf = np.load(model_file("whisper-assets", "mel_filters.npz"))
    a80 = read_wav16(clip_path("0880"))
    m = whisper_log_mel(a80, mf["mel_80"])
    np.save(os.path.join(OUT, "mel80_0880.npy"), m)
    a930 = read_wav16(clip_path("0930"))
    m = whisper_log_mel(a930, mf["mel_128"])
    np.save(os.path.join(OUT, "mel128_0930_every4.npy"), np.ascontiguousarray(m[:, ::4]))
    a870 = read_wav16(clip_path("0870"))
    m = whisper_log_mel(a870, mf["mel_80"], padding=480000)
    np.save(os.path.join(OUT, "mel80_0870_pad30s_every16.npy"), np.ascontiguousarray(m[:, ::16]))
    print("mel: written", m.shape)

    # --- VAD
    onnx_path = model_file("silero-vad", "silero_vad_16k_op15.onnx")
    st_path = model_file("silero-vad", "silero_vad_16k.safetensors")
    from safetensors.numpy import load_file

    st = {k: v.astype(np.float64) for k, v in load_file(st_path).items()}
    ow = onnx_weights(onnx_path)
    src = args.silero_src or fetch_silero_src()
    stamps = silero_timestamps_fn(src)
    probs_onnx, probs_st, segs = {}, {}, {}
    for c in CLIPS + ["concat"]:
        wav = concat_audio() if c == "concat" else read_wav16(clip_path(c))
        po = ort_probs(onnx_path, wav)
        check = tiny_silero_probs(ow, wav)
        err = float(np.abs(check - po).max())
        assert err < 1e-5, f"numpy TinySileroVAD with the ONNX weights is {err} from onnxruntime"
        ps = tiny_silero_probs(st, wav)
        probs_onnx[c] = [round(float(p), 7) for p in po]
        probs_st[c] = [round(float(p), 7) for p in ps]
        segs[c] = {
            "samples": len(wav),
            "cases": {
                name: [[s["start"], s["end"]] for s in stamps([float(p) for p in po], audio_length_samples=len(wav), **kw)]
                for name, kw in SEGMENT_CASES.items()
            },
        }
        print(f"vad {c}: {len(po)} windows, numpy-vs-ort {err:.2e}, safetensors-vs-onnx {np.abs(ps - po).max():.3f}")
    json.dump(
        {
            "onnx": "silero_vad_16k_op15.onnx (silero-vad 6.2.3), onnxruntime " + __import__("onnxruntime").__version__,
            "probs": probs_onnx,
        },
        open(os.path.join(OUT, "vad_probs_onnx.json"), "w"),
    )
    json.dump(
        {"safetensors": "silero_vad_16k.safetensors (silero-vad 6.2.3), TinySileroVAD in numpy", "probs": probs_st},
        open(os.path.join(OUT, "vad_probs_safetensors.json"), "w"),
    )
    json.dump({"options": SEGMENT_CASES, "concat": CONCAT, "segments": segs}, open(os.path.join(OUT, "vad_segments.json"), "w"), indent=0)

    # --- decoding (libsndfile)
    import soundfile as sf

    data = args.pygame_data or os.path.join(HOME, "models", "audio-test-pygame")
    dec = {}
    for name in ["house_lo.wav", "house_lo.ogg", "house_lo.mp3"]:
        x, sr = sf.read(os.path.join(data, name), dtype="float64", always_2d=True)
        mono = x.mean(axis=1)
        dec[name] = {
            "sample_rate": sr,
            "channels": x.shape[1],
            "frames": x.shape[0],
            "rms": float(np.sqrt((mono**2).mean())),
            "head": [round(float(v), 7) for v in mono[:32]],
        }
    for c in CLIPS:
        x, sr = sf.read(clip_path(c), dtype="float64", always_2d=True)
        dec[f"librivox-{c}"] = {
            "sample_rate": sr,
            "channels": x.shape[1],
            "frames": x.shape[0],
            "rms": float(np.sqrt((x[:, 0] ** 2).mean())),
            "head": [round(float(v), 7) for v in x[:32, 0]],
        }
    json.dump(dec, open(os.path.join(OUT, "decode_ref.json"), "w"), indent=1)
    print("decode: written", list(dec))


if __name__ == "__main__":
    main()
