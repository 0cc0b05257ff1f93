"""faster-whisper side of `cargo xtask bench whisper` (run from a venv outside the repo:
python3 -m venv /tmp/fwvenv && /tmp/fwvenv/bin/pip install faster-whisper).

Usage: bench_reference.py MODEL_DIR AUDIO.wav THREADS COMPUTE_TYPES BEAMS REPS
prints one JSON object: per (compute type, beam): best seconds, text, segments.
The model directory is the CTranslate2 one sapient-hub cached (model.bin, config.json,
tokenizer.json, vocabulary.txt); options are faster-whisper's defaults (temperature
fallback, condition on previous text, no VAD, no word timestamps) except the beam size.
"""
import json
import sys
import time

import faster_whisper
from faster_whisper import WhisperModel
from faster_whisper.audio import decode_audio


def main():
    model_dir, wav, threads, compute_types, beams, reps = sys.argv[1:7]
    audio = decode_audio(wav, sampling_rate=16000)
    out = {"faster_whisper": faster_whisper.__version__, "runs": []}
    try:
        import ctranslate2
        out["ctranslate2"] = ctranslate2.__version__
    except Exception:
        pass
    for ct in compute_types.split(","):
        model = WhisperModel(model_dir, device="cpu", compute_type=ct, cpu_threads=int(threads))
        for beam in [int(b) for b in beams.split(",")]:
            best = float("inf")
            text, segs = "", []
            for _ in range(int(reps)):
                t = time.perf_counter()
                segments, info = model.transcribe(audio, beam_size=beam, language="en")
                segs = [(s.start, s.end, s.text) for s in segments]
                best = min(best, time.perf_counter() - t)
                text = "".join(s[2] for s in segs)
            out["runs"].append({"compute_type": ct, "beam": beam, "seconds": best, "text": text, "segments": segs})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
