"""Word timestamps of faster-whisper on the LibriVox clips, for
crates/sapient-whisper/tests/words.rs (run from a venv outside the repo with faster-whisper).

Usage: make_word_reference.py CT2_MODEL_DIR LIBRIVOX_DIR OUT.json
Greedy (beam 1), float32, English, word_timestamps=True, otherwise faster-whisper defaults.
"""
import json
import sys

import faster_whisper
from faster_whisper import WhisperModel

CLIPS = ["0870", "0880", "0890", "0920", "0930"]


def main():
    model_dir, clips_dir, out = sys.argv[1:4]
    model = WhisperModel(model_dir, device="cpu", compute_type="float32", cpu_threads=2)
    result = {"faster_whisper": faster_whisper.__version__, "model": model_dir.rstrip("/").split("/")[-1], "clips": {}}
    for c in CLIPS:
        wav = f"{clips_dir}/sense_and_sensibility_01_austen_64kb-{c}.wav"
        segments, _ = model.transcribe(wav, beam_size=1, language="en", word_timestamps=True)
        words = [[w.word, round(w.start, 3), round(w.end, 3)] for s in segments for w in s.words]
        result["clips"][c] = words
    with open(out, "w") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
