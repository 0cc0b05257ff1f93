"""onnxruntime side of `cargo xtask bench tts` (run from a venv outside the repo with numpy and
onnxruntime, e.g. /tmp/kokvenv).

Usage: bench_reference.py MODEL.onnx INPUT.json THREADS REPS
INPUT.json (written by the bench): {"speed": s, "chunks": [{"ids": [...], "style": [256 floats]}]}
the same phoneme ids (without the 0 padding) and style rows our side synthesizes.
Prints one JSON object: onnxruntime version, best total seconds over REPS (after one warm-up
pass), the best time to the first chunk's audio, samples per chunk, CPU seconds and the
process's peak resident memory (MB: VmHWM of /proc/self/status, ru_maxrss where there is no
such file; ru_maxrss alone would report the bench's own peak, since Linux keeps it across the
fork and exec that start this script).
"""
import json
import resource
import sys
import time

import numpy as np
import onnxruntime as ort


def peak_rss_mb():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main():
    onnx, inp, threads, reps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    d = json.load(open(inp))
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(onnx, so, providers=["CPUExecutionProvider"])
    speed = np.array([d["speed"]], dtype=np.float32)
    feeds = [{"tokens": np.array([[0, *c["ids"], 0]], dtype=np.int64),
              "style": np.array(c["style"], dtype=np.float32)[None, :],
              "speed": speed} for c in d["chunks"]]
    sess.run(["audio"], feeds[0])  # warm-up
    best, best_first, best_cpu = float("inf"), float("inf"), float("inf")
    samples = []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        samples, first = [], None
        for f in feeds:
            a = sess.run(["audio"], f)[0]
            samples.append(int(a.size))
            if first is None:
                first = time.perf_counter() - t0
        total = time.perf_counter() - t0
        best_cpu = min(best_cpu, time.process_time() - c0)
        best, best_first = min(best, total), min(best_first, first)
    print(json.dumps({"onnxruntime": ort.__version__, "seconds": best, "first_chunk_seconds": best_first,
                      "cpu_seconds": best_cpu, "samples": samples,
                      "peak_rss_mb": peak_rss_mb()}))


if __name__ == "__main__":
    main()
