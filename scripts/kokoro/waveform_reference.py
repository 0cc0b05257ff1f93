#!/usr/bin/env python3
"""Reference waveform of Kokoro-82M from onnxruntime on the int8 export, for
crates/sapient-kokoro/tests/model.rs (see docs/kokoro.md, "The model").

Runs `kokoro-v1.0.int8.onnx` on fixed phoneme ids with the `jf_alpha` voice (row = number of
phonemes), speed 1, with three intermediate tensors added as graph outputs (the durations
before rounding `/encoder/Div_output_0`, after `/encoder/Clip_output_0`, and the F0 curve
`/encoder/Squeeze_output_0`), and writes to crates/sapient-kokoro/tests/data/:
  kokoro_reference.json  ids, voice, speed, durations (raw and rounded), F0, sample count
  kokoro_reference.pcm   the waveform as little-endian int16, times pcm_scale (in the json)

With --bench it also times onnxruntime (2 threads) on a ~10 s utterance and prints the
seconds of compute per second of audio.

  /tmp/kokvenv/bin/python scripts/kokoro/waveform_reference.py ~/.cache/sapient/models/kokoro-82m
"""
import json, sys, time, os
import numpy as np
import onnx
import onnxruntime as ort

SHORT = "kˈonnitʃiwa, kokˈoɾo dˈesu."
LONG = ("ʃˈiɾoi kɯmˈo ɡa, aˈoi soɾˈa no nˈaka o jˈɯkkɯɾi to nˈaɡaɾete ikimˈasɯ. "
        "kˈjoː wa tˈotemo ii tˈeŋki de, kˈoːeŋ ni wa takˈusaŋ no hˈito ɡa imˈasɯ.")
OUTS = ["/encoder/Div_output_0", "/encoder/Clip_output_0", "/encoder/Squeeze_output_0"]


def ids_of(text, vocab):
    ids, dropped = [], set()
    for ch in text:
        if ch in vocab:
            ids.append(vocab[ch])
        else:
            dropped.add(ch)
    if dropped:
        print("dropped (not in vocab):", sorted(dropped), file=sys.stderr)
    return ids


def session(path, threads=2):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def run(sess, ids, style, speed=1.0, extra=True):
    feeds = {"tokens": np.array([[0, *ids, 0]], dtype=np.int64),
             "style": style[None, :].astype(np.float32),
             "speed": np.array([speed], dtype=np.float32)}
    names = ["audio"] + (OUTS if extra else [])
    return dict(zip(names, sess.run(names, feeds)))


def main():
    d = os.path.expanduser(sys.argv[1])
    bench = "--bench" in sys.argv
    onnx_path = os.path.join(d, "kokoro-v1.0.int8.onnx")
    vocab = json.load(open(os.path.join(d, "vocab.json")))["vocab"]
    voices = np.load(os.path.join(d, "voices_ja.npz"))
    m = onnx.load(onnx_path)
    for n in OUTS:
        m.graph.output.append(onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None))
    tmp = "/tmp/kokoro_with_outputs.onnx"
    onnx.save(m, tmp)
    sess = session(tmp)
    ids = ids_of(SHORT, vocab)
    style = voices["jf_alpha"][len(ids), 0]
    r = run(sess, ids, style)
    audio = r["audio"].reshape(-1).astype("<f4")
    out = os.path.join(os.path.dirname(__file__), "../../crates/sapient-kokoro/tests/data")
    ref = {
        "source": "onnxruntime %s on kokoro-v1.0.int8.onnx, voice jf_alpha row len(ids), speed 1" % ort.__version__,
        "phonemes": SHORT,
        "ids": ids,
        "voice": "jf_alpha",
        "speed": 1.0,
        "raw_durations": [float(v) for v in r[OUTS[0]].reshape(-1)],
        "durations": [int(v) for v in r[OUTS[1]].reshape(-1)],
        "f0": [float(v) for v in r[OUTS[2]].reshape(-1)],
        "samples": int(audio.size),
        "pcm_scale": float(np.abs(audio).max()) / 32767.0,
    }
    pcm = np.round(audio / ref["pcm_scale"]).astype("<i2")
    json.dump(ref, open(os.path.join(out, "kokoro_reference.json"), "w"), indent=0)
    pcm.tofile(os.path.join(out, "kokoro_reference.pcm"))
    print(f"{len(ids)} ids, {sum(ref['durations'])} frames, {audio.size} samples")
    if bench:
        sess = session(onnx_path)
        ids = ids_of(LONG, vocab)
        style = voices["jf_alpha"][len(ids), 0]
        run(sess, ids, style, extra=False)  # warm-up
        best, best_cpu = 1e9, 1e9
        for _ in range(3):
            t, c = time.perf_counter(), time.process_time()
            a = run(sess, ids, style, extra=False)["audio"]
            best = min(best, time.perf_counter() - t)
            best_cpu = min(best_cpu, time.process_time() - c)
        secs = a.size / 24000
        print(f"onnxruntime 2 threads: {len(ids)} ids, {secs:.2f} s audio, {best:.3f} s compute, {best / secs:.3f} s per s of audio; "
              f"CPU time {best_cpu:.2f} s ({best_cpu / secs:.3f} CPU-s per s of audio)")


if __name__ == "__main__":
    main()
