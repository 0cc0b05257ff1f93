#!/usr/bin/env python3
"""Python side of `cargo xtask bench audio`: times the reference implementations on the
same audio the Rust side uses and prints one JSON object.

* log-mel: whisper/audio.py's computation in numpy (float32 signal, np.fft.rfft over all
  frames at once, mel filters from mel_filters.npz, log10 clamp), the usual numpy port;
* Silero VAD: onnxruntime on silero_vad_16k_op15.onnx, window by window as
  silero_vad.get_speech_timestamps drives it (OnnxWrapper: 1 intra-op thread).

Needs numpy and onnxruntime (a venv outside the repo, given to the bench with --python or
SAPIENT_REF_PYTHON).
"""

import argparse
import json
import time

import numpy as np


def log_mel(audio, filters, n_fft=400, hop=160):
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)).astype(np.float32)
    x = np.pad(audio, n_fft // 2, mode="reflect")
    n_frames = 1 + (len(x) - n_fft) // hop
    frames = np.lib.stride_tricks.as_strided(x, (n_frames, n_fft), (x.strides[0] * hop, x.strides[0]))
    stft = np.fft.rfft(frames * window, axis=-1)
    mag = (np.abs(stft[:-1]) ** 2).astype(np.float32)
    mel = filters @ mag.T
    log_spec = np.log10(np.maximum(mel, 1e-10))
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    return (log_spec + 4.0) / 4.0


def vad_probs(session, wav):
    state = np.zeros((2, 1, 128), np.float32)
    ctx = np.zeros((1, 64), np.float32)
    sr = np.array(16000, dtype=np.int64)
    out = []
    for i in range(0, len(wav), 512):
        chunk = wav[i : i + 512]
        if len(chunk) < 512:
            chunk = np.pad(chunk, (0, 512 - len(chunk)))
        x = np.concatenate([ctx, chunk[None, :]], axis=1)
        o, state = session.run(None, {"input": x, "state": state, "sr": sr})
        out.append(o[0, 0])
        ctx = x[:, -64:]
    return np.array(out)


def best(fn, reps):
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--audio", required=True, help="raw little-endian f32, 16 kHz mono")
    ap.add_argument("--filters", required=True, help="mel_filters.npz")
    ap.add_argument("--onnx", required=True, help="silero_vad_16k_op15.onnx")
    ap.add_argument("--mel-seconds", type=float, nargs="+", default=[30, 600])
    ap.add_argument("--vad-seconds", type=float, default=600)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    import onnxruntime as ort

    audio = np.fromfile(a.audio, dtype="<f4")
    filters = np.load(a.filters)["mel_80"]
    res = {"numpy": np.__version__, "onnxruntime": ort.__version__, "mel_s": {}, "vad_s": None}
    for secs in a.mel_seconds:
        x = audio[: int(secs * 16000)]
        res["mel_s"][str(int(secs))] = best(lambda: log_mel(x, filters), a.reps)
    opts = ort.SessionOptions()
    opts.inter_op_num_threads = 1
    opts.intra_op_num_threads = 1
    s = ort.InferenceSession(a.onnx, providers=["CPUExecutionProvider"], sess_options=opts)
    x = audio[: int(a.vad_seconds * 16000)]
    res["vad_s"] = best(lambda: vad_probs(s, x), max(1, a.reps - 1))
    res["vad_windows"] = (len(x) + 511) // 512
    print(json.dumps(res))


if __name__ == "__main__":
    main()
