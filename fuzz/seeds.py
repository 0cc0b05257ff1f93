#!/usr/bin/env python3
"""Write small GGUF seeds for the `gguf` fuzz target into fuzz/corpus/gguf/.

One file per ggml type (the types candle holds and a few it does not), each with metadata of
every GGUF value type (arrays of numbers, strings and arrays included), plus a GGUF v2 file,
a custom-alignment file and a zero-tensor file. Written by hand with `struct`, independently
of our writer, so the seeds do not share its assumptions.

    python3 fuzz/seeds.py && RUSTC_BOOTSTRAP=1 cargo fuzz run gguf -s none -- -max_len=8192
"""
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
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus", "gguf")
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


if __name__ == "__main__":
    main()
