"""Word-level reference for sapient-kokoro's English G2P: misaki 0.9.4's own `Lexicon`
(the lexicon half of `misaki.en.G2P`, which Kokoro's KPipeline uses for English) on a list of
words and numbers, written to crates/sapient-kokoro/tests/data/g2p_misaki_words.json.

misaki's sentence-level G2P needs spaCy's en_core_web_sm (a POS tagger) which is not
installable here, so this calls `Lexicon(token, ctx)` directly with no part-of-speech tag
(tag None: dict entries take their DEFAULT, like our G2P) and no right context; spaCy is
stubbed only so that `misaki.en` imports. Kokoro v1.0 runs misaki with version None, which
maps 'ɾ' -> 'T' and 'ʔ' -> 't' at the end; that is applied here too. Words misaki has no
phonemes for (no fallback configured) are written with null.

Usage (a venv with misaki==0.9.4's files, num2words and regex; misaki itself is imported
from MISAKI_DIR, the unpacked wheel, so that its spaCy dependency is not needed):
    MISAKI_DIR=/tmp/misakiw /tmp/kokvenv/bin/python scripts/kokoro/g2p_reference.py
"""
import json
import os
import re
import sys
import types

sys.path.insert(0, os.environ.get("MISAKI_DIR", "/tmp/misakiw"))
sys.modules["spacy"] = types.ModuleType("spacy")  # only G2P (not Lexicon) touches spaCy

from misaki import en  # noqa: E402
from misaki.token import MToken  # noqa: E402

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "crates", "sapient-kokoro", "tests", "data",
                   "g2p_misaki_words.json")

# Words from the project's own prose (docs/*.md, README.md): common and technical vocabulary,
# capitalised at sentence starts, many out of the lexicons.
def doc_words():
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    words = []
    for name in ["README.md", "docs/architecture.md", "docs/whisper.md", "docs/kokoro.md"]:
        p = os.path.join(root, name)
        if os.path.exists(p):
            words += re.findall(r"[A-Za-z][a-z]+(?:'[a-z]+)?", open(p, encoding="utf-8").read())
    seen, out = set(), []
    for w in words:
        if w not in seen:
            seen.add(w)
            out.append(w)
    # every 7th distinct word: a spread over the text, ~ a few hundred
    return out[::7]

HAND = [
    # lexicon, dict entries (DEFAULT), capitals, all caps, apostrophes
    "hello", "world", "Hello", "HELLO", "read", "live", "record", "object", "wind", "lead",
    "don't", "won't", "it's", "we're", "they'd", "o'clock", "Kokoro", "London", "NASA", "FBI",
    "USA", "TV", "OK", "iPhone", "McDonald", "Tokyo", "Japanese", "English",
    # inflections the lexicon may not list (stem rules -s / -ed / -ing)
    "kokoros", "tweeted", "tweeting", "googled", "googling", "emailed", "blogs", "blogged",
    "podcasts", "texted", "texting", "uploaded", "uploading", "streamed", "reboots", "rebooting",
    "unzipped", "hashes", "fixes", "parties", "copied", "stopped", "planned", "running",
    "dogs'", "cat's", "James's", "boxes", "cities", "wanted", "needed", "liked", "played",
    "waited", "hated", "hoped", "making", "getting", "writing", "sitting", "hitting",
    # symbols
    "%", "&", "+", "@",
    # numbers: cardinals, years, ordinals, decimals, commas, negatives, suffixes
    "0", "1", "7", "13", "21", "42", "99", "100", "101", "110", "123", "250", "999", "1000",
    "1001", "1100", "1999", "1984", "2000", "2005", "2024", "1905", "1066", "12345", "100000",
    "1,000", "1,234,567", "3.14", "0.5", "10.05", ".5", "-7", "-3.5", "1st", "2nd", "3rd", "4th",
    "11th", "21st", "22nd", "100th", "1990s", "80s", "2000s", "1.2.3", "007", "0800",
]
CURRENCY = [("$", "5"), ("$", "1"), ("$", "3.50"), ("$", "1.01"), ("£", "20"), ("€", "2.5"), ("$", "100")]


def run(lex, word, currency=None):
    tk = MToken(text=word, tag=None, whitespace="",
                _=MToken.Underscore(is_head=True, num_flags="", prespace=False, currency=currency))
    ps, _rating = lex(tk, en.TokenContext())
    if ps is None:
        return None
    return ps.replace("ɾ", "T").replace("ʔ", "t")


def main():
    lex = en.Lexicon(british=False)
    rows = []
    seen = set()
    for w in HAND + doc_words():
        if w in seen or w in ("a", "A", "am", "an", "I", "by", "to", "in", "the", "The", "used", "vs"):
            continue  # these depend on spaCy's tag or the right context
        seen.add(w)
        rows.append({"text": w, "phonemes": run(lex, w)})
    for cur, num in CURRENCY:
        rows.append({"text": num, "currency": cur, "phonemes": run(lex, num, cur)})
    with open(OUT, "w", encoding="utf-8") as f:
        f.write('{"source": "misaki 0.9.4 en.Lexicon(british=False), tag None, no context",\n"words": [\n')
        f.write(",\n".join(json.dumps(r, ensure_ascii=False) for r in rows))
        f.write("\n]}\n")
    print(len(rows), "rows,", sum(r["phonemes"] is None for r in rows), "without phonemes ->", OUT)


if __name__ == "__main__":
    main()
