"""faster-whisper side of `cargo xtask bench whisper` (run from a venv outside the repo:
python3 -m venv /tmp/fwvenv && /tmp/fwvenv/bin/pip install faster-whisper).

Usage: bench_reference.py MODEL_DIR AUDIO.wav THREADS COMPUTE_TYPES BEAMS REPS [MODE]
prints one JSON object: per (compute type, beam): best seconds, text, segments, and the
process's peak resident set size (`peak_rss_kb`, ru_maxrss: run one compute type and mode
per process to read it per configuration).
The model directory is the CTranslate2 one sapient-hub cached (model.bin, config.json,
tokenizer.json, vocabulary.txt); options are faster-whisper's defaults except the beam size.
MODE `sequential` (default): `WhisperModel.transcribe` (temperature fallback, condition on
previous text, no VAD, no word timestamps). MODE `batched`: `BatchedInferencePipeline`
with batch_size 8 (its defaults: Silero VAD chunks of up to 30 s, no conditioning).
"""
import json
import sys
import time

import faster_whisper
import resource

from faster_whisper import BatchedInferencePipeline, WhisperModel
from faster_whisper.audio import decode_audio


def main():
    model_dir, wav, threads, compute_types, beams, reps = sys.argv[1:7]
    mode = sys.argv[7] if len(sys.argv) > 7 else "sequential"
    audio = decode_audio(wav, sampling_rate=16000)
    out = {"faster_whisper": faster_whisper.__version__, "runs": []}
    try:
        import ctranslate2
        out["ctranslate2"] = ctranslate2.__version__
    except Exception:
        pass
    for ct in compute_types.split(","):
        model = WhisperModel(model_dir, device="cpu", compute_type=ct, cpu_threads=int(threads))
        pipe = BatchedInferencePipeline(model=model) if mode == "batched" else None
        for beam in [int(b) for b in beams.split(",")]:
            best = float("inf")
            text, segs = "", []
            for _ in range(int(reps)):
                t = time.perf_counter()
                if pipe is None:
                    segments, info = model.transcribe(audio, beam_size=beam, language="en")
                else:
                    segments, info = pipe.transcribe(audio, beam_size=beam, language="en", batch_size=8)
                segs = [(s.start, s.end, s.text) for s in segments]
                best = min(best, time.perf_counter() - t)
                text = "".join(s[2] for s in segs)
            out["runs"].append({"compute_type": ct, "mode": mode, "beam": beam, "seconds": best, "text": text, "segments": segs})
    out["peak_rss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps(out))


if __name__ == "__main__":
    main()
