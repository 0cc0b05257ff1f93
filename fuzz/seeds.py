#!/usr/bin/env python3
"""Write the seed corpora of the fuzz targets into fuzz/corpus/<target>/.

`gguf` (and `gguf_tokenizer`, which adds tokenizer metadata): one file per ggml type (the types candle holds and a few it does not), each with metadata of
every GGUF value type (arrays of numbers, strings and arrays included), plus a GGUF v2 file,
a custom-alignment file and a zero-tensor file. Written by hand with `struct`, independently
of our writer, so the seeds do not share its assumptions. The other targets get small files
of their formats written here the same way (CTranslate2 model.bin, ONNX protobuf, safetensors,
npy/npz, WAV, regexes and JSON Schemas, tokenizer.json, server request bodies) or copied from the repository's test
data (the .pt voice packs, the chat templates).

    python3 fuzz/seeds.py && RUSTC_BOOTSTRAP=1 cargo fuzz run gguf -s none -- -max_len=8192
"""
import json
import os
import random
import struct
import sys

# ggml type id -> (name, block elements, block bytes)
TYPES = {
    0: ("f32", 1, 4), 1: ("f16", 1, 2), 2: ("q4_0", 32, 18), 3: ("q4_1", 32, 20),
    6: ("q5_0", 32, 22), 7: ("q5_1", 32, 24), 8: ("q8_0", 32, 34), 9: ("q8_1", 32, 36),
    10: ("q2_k", 256, 84), 11: ("q3_k", 256, 110), 12: ("q4_k", 256, 144),
    13: ("q5_k", 256, 176), 14: ("q6_k", 256, 210), 15: ("q8_k", 256, 292),
    16: ("iq2_xxs", 256, 66), 20: ("iq4_nl", 32, 18), 24: ("i8", 1, 1), 26: ("i32", 1, 4),
    30: ("bf16", 1, 2),
}


def s(x: str) -> bytes:
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def metadata(alignment=None) -> list:
    out = [
        kv("general.architecture", 8, s("llama")),
        kv("t.u8", 0, struct.pack("<B", 7)), kv("t.i8", 1, struct.pack("<b", -7)),
        kv("t.u16", 2, struct.pack("<H", 700)), kv("t.i16", 3, struct.pack("<h", -700)),
        kv("t.u32", 4, struct.pack("<I", 70000)), kv("t.i32", 5, struct.pack("<i", -70000)),
        kv("t.f32", 6, struct.pack("<f", 1e-5)), kv("t.bool", 7, struct.pack("<B", 1)),
        kv("t.u64", 10, struct.pack("<Q", 1 << 40)), kv("t.i64", 11, struct.pack("<q", -(1 << 40))),
        kv("t.f64", 12, struct.pack("<d", 1e5)),
        kv("t.arr_i32", 9, struct.pack("<IQ", 5, 3) + struct.pack("<3i", 1, -2, 3)),
        kv("t.arr_str", 9, struct.pack("<IQ", 8, 2) + s("a b") + s("<|im_end|>")),
        kv("t.arr_arr", 9, struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 4, 1) + struct.pack("<I", 9)),
    ]
    if alignment is not None:
        out.append(kv("general.alignment", 4, struct.pack("<I", alignment)))
    return out


def gguf(tensors, version=3, alignment=32, kvs=None) -> bytes:
    """tensors: list of (name, ne (ggml order), type id, data bytes)."""
    kvs = metadata(None if alignment == 32 else alignment) if kvs is None else kvs
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs)) + b"".join(kvs)
    infos, blob = b"", b""
    for name, ne, tid, data in tensors:
        infos += s(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
        infos += struct.pack("<IQ", tid, len(blob))
        blob += data + b"\0" * (-len(data) % alignment)
    header = head + infos
    return header + b"\0" * (-len(header) % alignment) + blob


def tensor(name, tid, rows, rng):
    _, blk, size = TYPES[tid]
    data = bytes(rng.getrandbits(8) for _ in range(rows * size))
    return (name, [blk, rows], tid, data)


def main():
    root = os.path.dirname(os.path.abspath(__file__))
    corpus = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "corpus")
    out = os.path.join(corpus, "gguf")
    os.makedirs(out, exist_ok=True)
    rng = random.Random(0)
    files = {}
    for tid, (name, _, _) in TYPES.items():
        files[f"seed-{name}"] = gguf([tensor("blk.0.attn_q.weight", tid, 2, rng),
                                      ("output_norm.weight", [4], 0, struct.pack("<4f", 1, 2, 3, 4))])
    files["seed-v2"] = gguf([tensor("token_embd.weight", 8, 1, rng)], version=2)
    files["seed-align64"] = gguf([tensor("a", 2, 1, rng), tensor("b", 12, 1, rng)], alignment=64)
    files["seed-no-tensors"] = gguf([])
    files["seed-3d"] = gguf([("c", [32, 2, 2], 8, bytes(rng.getrandbits(8) for _ in range(4 * 34)))])
    for n, b in files.items():
        with open(os.path.join(out, n), "wb") as f:
            f.write(b)
    print(f"{len(files)} seeds in {out}, largest {max(map(len, files.values()))} bytes")
    others = {
        "gguf_tokenizer": tokenizer_ggufs(),
        "ct2": ct2_seeds(rng),
        "onnx": onnx_seeds(),
        "safetensors": safetensors_seeds(),
        "npy": npy_seeds(),
        "pt_voices": copied(os.path.join(root, "..", "crates", "sapient-kokoro", "tests", "data"), ".pt"),
        "tokenizer_json": {"bpe.json": TOKENIZER_JSON.encode()},
        "chat_template": template_seeds(os.path.join(root, "..", "tests", "data", "tokenizers", "templates")),
        "audio": wav_seeds(),
        "grammar": grammar_seeds(),
        "server_request": server_request_seeds(),
    }
    for target, seeds in others.items():
        d = os.path.join(corpus, target)
        os.makedirs(d, exist_ok=True)
        for n, b in seeds.items():
            with open(os.path.join(d, n), "wb") as f:
                f.write(b)
        print(f"{len(seeds)} seeds in {d}")


def tokenizer_ggufs() -> dict:
    kvs = [
        kv("general.architecture", 8, s("llama")),
        kv("tokenizer.ggml.model", 8, s("gpt2")),
        kv("tokenizer.ggml.pre", 8, s("smollm")),
        kv("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 6) + b"".join(s(t) for t in ["a", "b", "ab", "\u0120", "<|im_end|>", "<|im_start|>"])),
        kv("tokenizer.ggml.token_type", 9, struct.pack("<IQ", 5, 6) + struct.pack("<6i", 1, 1, 1, 1, 3, 3)),
        kv("tokenizer.ggml.merges", 9, struct.pack("<IQ", 8, 1) + s("a b")),
        kv("tokenizer.ggml.bos_token_id", 4, struct.pack("<I", 5)),
        kv("tokenizer.ggml.eos_token_id", 4, struct.pack("<I", 4)),
        kv("tokenizer.chat_template", 8, s("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}")),
    ]
    spm = [
        kv("general.architecture", 8, s("llama")),
        kv("tokenizer.ggml.model", 8, s("llama")),
        kv("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 5) + b"".join(s(t) for t in ["<unk>", "<s>", "</s>", "\u2581a", "b"])),
        kv("tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, 5) + struct.pack("<5f", 0, 0, 0, -1, -2)),
        kv("tokenizer.ggml.token_type", 9, struct.pack("<IQ", 5, 5) + struct.pack("<5i", 2, 3, 3, 1, 1)),
    ]
    return {"bpe.gguf": gguf([], kvs=kvs), "spm.gguf": gguf([], kvs=spm)}


def ct2_string(x: str) -> bytes:
    b = x.encode() + b"\0"
    return struct.pack("<H", len(b)) + b


def ct2_seeds(rng) -> dict:
    def var(name, dims, dtype, data):
        return ct2_string(name) + struct.pack("<B", len(dims)) + struct.pack(f"<{len(dims)}I", *dims) + struct.pack("<BI", dtype, len(data)) + data
    vs = [
        var("encoder/num_heads", [], 3, struct.pack("<i", 6)),
        var("encoder/conv1/weight", [4, 2, 3], 0, bytes(rng.getrandbits(8) for _ in range(96))),
        var("decoder/embeddings/weight", [8, 4], 4, bytes(rng.getrandbits(8) for _ in range(64))),
        var("decoder/num_heads", [], 1, b"\x01"),
    ]
    body = struct.pack("<I", 6) + ct2_string("WhisperSpec") + struct.pack("<II", 1, len(vs)) + b"".join(vs)
    body += struct.pack("<I", 1) + ct2_string("decoder/projection/weight") + ct2_string("decoder/embeddings/weight")
    return {"whisper-like.bin": body}


def pb_varint(v: int) -> bytes:
    out = b""
    while True:
        b = v & 0x7F
        v >>= 7
        if v == 0:
            return out + bytes([b])
        out += bytes([b | 0x80])


def pb_int(f: int, v: int) -> bytes:
    return pb_varint(f << 3) + pb_varint(v & (2**64 - 1))


def pb_bytes(f: int, b: bytes) -> bytes:
    return pb_varint(f << 3 | 2) + pb_varint(len(b)) + b


def onnx_seeds() -> dict:
    raw = pb_int(1, 2) + pb_int(1, 3) + pb_int(2, 1) + pb_bytes(8, b"w") + pb_bytes(9, struct.pack("<6f", *range(6)))
    typed = pb_int(1, 3) + pb_int(2, 7) + pb_bytes(8, b"shape") + pb_bytes(7, b"\x01\x02\x03")
    floats = pb_int(1, 2) + pb_int(2, 1) + pb_bytes(8, b"s") + pb_bytes(4, struct.pack("<2f", 0.5, 0.25))
    attr = pb_bytes(1, b"value") + pb_int(20, 4) + pb_bytes(5, typed)
    sub = pb_bytes(1, pb_bytes(1, b"x") + pb_bytes(2, b"z") + pb_bytes(4, b"Identity"))
    attr_g = pb_bytes(1, b"then_branch") + pb_int(20, 5) + pb_bytes(6, sub)
    node = pb_bytes(1, b"x") + pb_bytes(2, b"y") + pb_bytes(4, b"Constant") + pb_bytes(5, attr) + pb_bytes(5, attr_g)
    shape = pb_bytes(1, pb_int(1, 4)) + pb_bytes(1, pb_bytes(2, b"n"))
    vi = pb_bytes(1, b"x") + pb_bytes(2, pb_bytes(1, pb_int(1, 1) + pb_bytes(2, shape)))
    graph = pb_bytes(1, node) + pb_bytes(5, raw) + pb_bytes(5, typed) + pb_bytes(5, floats) + pb_bytes(11, vi)
    model = pb_int(1, 9) + pb_bytes(8, pb_int(2, 17)) + pb_bytes(7, graph)
    return {"small.onnx": model}


def safetensors_file(header: str, data: bytes) -> bytes:
    h = header.encode()
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds() -> dict:
    return {
        "two.safetensors": safetensors_file(
            '{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"BF16","shape":[4],"data_offsets":[16,24]}}',
            struct.pack("<4f", 1, 2, 3, 4) + b"\x80\x3f" * 4),
        "f16.safetensors": safetensors_file('{"h":{"dtype":"F16","shape":[3],"data_offsets":[0,6]}}', b"\x00\x3c" * 3),
    }


def npy_file(descr: str, shape: str, data: bytes) -> bytes:
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"
    header += " " * (-(10 + len(header) + 1) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data


def npy_seeds() -> dict:
    import io
    import zipfile
    a = npy_file("<f4", "(2, 3)", struct.pack("<6f", *range(6)))
    b = npy_file("|u1", "(4,)", bytes([1, 2, 3, 4]))
    c = npy_file("<f2", "()", b"\x00\x3c")
    out = {"a.npy": a, "b.npy": b, "c.npy": c}
    for name, method in [("stored.npz", zipfile.ZIP_STORED), ("deflated.npz", zipfile.ZIP_DEFLATED)]:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", method) as z:
            z.writestr("a.npy", a)
            z.writestr("b.npy", b)
        out[name] = buf.getvalue()
    return out


def copied(d: str, ext: str) -> dict:
    return {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d)) if n.endswith(ext)}


def template_seeds(d: str) -> dict:
    out = {}
    msgs = "system\0Be brief.\0user\0Hello {{ x }}\0assistant\0Hi!\0user\0<|im_end|>\0tool\0{\"a\": [1]}".encode()
    for mode in range(6):
        out[f"messages-{mode}"] = bytes([mode * 2]) + msgs
    for n, src in copied(d, ".jinja").items():
        if len(src) <= 8192:
            out[f"template-{n}"] = b"\x01" + src
    return out


def wav(rate: int, channels: int, samples: bytes, fmt: int = 1, bits: int = 16) -> bytes:
    block = channels * bits // 8
    fmt_chunk = struct.pack("<HHIIHH", fmt, channels, rate, rate * block, block, bits)
    body = b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt_chunk + b"data" + struct.pack("<I", len(samples)) + samples
    return b"RIFF" + struct.pack("<I", len(body)) + body


def wav_seeds() -> dict:
    import math
    tone = b"".join(struct.pack("<h", int(8000 * math.sin(i * 0.05))) for i in range(800))
    return {
        "mono16.wav": wav(16000, 1, tone),
        "stereo8k.wav": wav(8000, 2, tone),
        "float.wav": wav(22050, 1, struct.pack("<100f", *[i / 200 for i in range(100)]), fmt=3, bits=32),
        "u8.wav": wav(11025, 1, bytes(range(256)), bits=8),
    }


def grammar_seeds() -> dict:
    regexes = [r"[a-z]{2,5}(-[0-9]+)?\0abc-12", r"(foo|bar)*baz\d{3}\0foobarbaz123", r"\w+@\w+\.com\0a@b.com"]
    schemas = [
        '{"type":"object","properties":{"name":{"type":"string","maxLength":8},"age":{"type":"integer","minimum":0,"maximum":150},"tags":{"type":"array","items":{"enum":["a","b"]},"maxItems":3}},"required":["name"]}\0{"name":"x","age":3}',
        '{"anyOf":[{"type":"number","exclusiveMinimum":1.5},{"$ref":"#/$defs/d"}],"$defs":{"d":{"type":"string","format":"date"}}}\0"2024-01-02"',
        '{"type":"array","prefixItems":[{"const":1},{"type":"boolean"}],"items":false}\0[1,true]',
    ]
    out = {f"regex-{i}": b"\x00" + r.encode() for i, r in enumerate(regexes)}
    out.update({f"schema-{i}": b"\x01" + x.encode() for i, x in enumerate(schemas)})
    return out


def server_request_seeds() -> dict:
    """The endpoint byte (0 chat, 1 completions, 2 embeddings, 3 speech), then a JSON body."""
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    bodies = [
        (0, {"model": "m", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
             "temperature": 0.7, "top_p": 0.9, "max_tokens": 16, "stop": ["\n\n"], "logit_bias": {"42": -100}, "seed": 7,
             "stream": True, "stream_options": {"include_usage": True}}),
        (0, {"messages": [{"role": "user", "content": [{"type": "text", "text": "A person"}]}],
             "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}}),
        (0, {"messages": [{"role": "user", "content": "Weather in Paris?"},
                          {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                           "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                          {"role": "tool", "tool_call_id": "c1", "content": "18 C"}], "tools": [tool], "tool_choice": "required"}),
        (0, {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}, "n": 2}),
        (1, {"model": "m", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}),
        (1, {"prompt": [[1, 2, 3], [4, 5]], "n": 2, "stop": "."}),
        (2, {"input": ["The weather is lovely today.", "It's so sunny outside!"], "encoding_format": "base64"}),
        (2, {"input": [[101, 2023, 102]]}),
        (3, {"model": "tts-1", "input": "Hello there.", "voice": "af_heart", "speed": 1.2, "response_format": "pcm"}),
        (3, {"input": "Hi.", "voice": {"id": "alloy"}}),
    ]
    return {f"body-{i}": bytes([e]) + json.dumps(b).encode() for i, (e, b) in enumerate(bodies)}


TOKENIZER_JSON = (
    '{"version":"1.0","truncation":null,"padding":null,"added_tokens":[{"id":4,"content":"<|im_end|>","single_word":false,'
    '"lstrip":false,"rstrip":false,"normalized":false,"special":true}],"normalizer":null,"pre_tokenizer":{"type":"ByteLevel",'
    '"add_prefix_space":false,"trim_offsets":true,"use_regex":true},"post_processor":null,"decoder":{"type":"ByteLevel",'
    '"add_prefix_space":true,"trim_offsets":true,"use_regex":true},"model":{"type":"BPE","dropout":null,"unk_token":null,'
    '"continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,'
    '"vocab":{"a":0,"b":1,"ab":2,"\u0120":3,"<|im_end|>":4},"merges":["a b"]}}'
)


if __name__ == "__main__":
    main()
