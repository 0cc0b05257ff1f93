#!/usr/bin/env python3
"""References for `cargo xtask bench embed`: all-MiniLM-L6-v2 through onnxruntime.

No ONNX export of all-MiniLM-L6-v2 ships in a package, so this script writes the BERT graph
itself with `onnx.helper` from the preset's model.safetensors (standard ops: Gather,
LayerNormalization, MatMul, Softmax with an additive padding mask, Erf GELU, masked mean
pooling, L2 normalisation) and lets onnxruntime optimise it (ORT_ENABLE_ALL, which fuses
attention, GELU and layer norms where it can). Batches are padded to their longest
sentence and masked, as sentence-transformers does.

Input (JSON file): {"batches": [[[ids...], ...], ...], "reps": N, "threads": T}
Output (stdout, JSON): {"onnxruntime": version, "seconds": [best seconds per call, per batch], "check": first
embedding of the first batch}

Usage: python3 scripts/embed/bench_reference.py MODEL.safetensors INPUT.json
(venv outside the repo: pip install numpy onnx onnxruntime safetensors)
"""
import json
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import load_file

st_path, input_path = sys.argv[1:3]
cfg = json.load(open(input_path))
W = load_file(st_path)
pre = "bert." if "bert.embeddings.word_embeddings.weight" in W else ""
d, nh, nl = 384, 12, 6
hd = d // nh

inits, nodes = [], []


def init(name, arr):
    inits.append(numpy_helper.from_array(np.ascontiguousarray(arr.astype(np.float32) if arr.dtype != np.int64 else arr), name))
    return name


def node(op, ins, out=None, **kw):
    out = out or f"t{len(nodes)}"
    nodes.append(helper.make_node(op, ins, [out], **kw))
    return out


def const_i64(name, v):
    return init(name, np.array(v, dtype=np.int64))


e = pre + "embeddings."
words = node("Gather", [init("wemb", W[e + "word_embeddings.weight"]), "input_ids"])
pos = node("Gather", [init("pemb", W[e + "position_embeddings.weight"]), "position_ids"])
x = node("Add", [node("Add", [words, pos]), init("temb0", W[e + "token_type_embeddings.weight"][0])])
x = node("LayerNormalization", [x, init("eln_w", W[e + "LayerNorm.weight"]), init("eln_b", W[e + "LayerNorm.bias"])], epsilon=1e-12, axis=-1)
# additive mask [B, 1, 1, L]: 0 for tokens, -10000 for padding
maskf = node("Cast", ["attention_mask"], to=TensorProto.FLOAT)
neg = node("Mul", [node("Sub", [init("one", np.array(1.0)), maskf]), init("big", np.array(-10000.0))])
addmask = node("Unsqueeze", [neg, const_i64("ax12", [1, 2])])
shape_bl_h_d = const_i64("shp", [0, 0, nh, hd])
shape_bl_d = const_i64("shp2", [0, 0, d])
for i in range(nl):
    p = f"{pre}encoder.layer.{i}."

    def lin(inp, name):
        return node("Add", [node("MatMul", [inp, init(f"{i}{name}w", W[p + name + ".weight"].T)]), init(f"{i}{name}b", W[p + name + ".bias"])])

    def heads(t, perm):
        return node("Transpose", [node("Reshape", [t, shape_bl_h_d])], perm=perm)

    q = heads(lin(x, "attention.self.query"), [0, 2, 1, 3])
    k = heads(lin(x, "attention.self.key"), [0, 2, 3, 1])
    v = heads(lin(x, "attention.self.value"), [0, 2, 1, 3])
    s = node("Add", [node("Div", [node("MatMul", [q, k]), init(f"{i}sc", np.array(np.sqrt(hd)))]), addmask])
    a = node("MatMul", [node("Softmax", [s], axis=-1), v])
    a = node("Reshape", [node("Transpose", [a], perm=[0, 2, 1, 3]), shape_bl_d])
    x = node("LayerNormalization", [node("Add", [x, lin(a, "attention.output.dense")]), init(f"{i}l1w", W[p + "attention.output.LayerNorm.weight"]), init(f"{i}l1b", W[p + "attention.output.LayerNorm.bias"])], epsilon=1e-12, axis=-1)
    h = lin(x, "intermediate.dense")
    g = node("Mul", [node("Mul", [h, init(f"{i}half", np.array(0.5))]), node("Add", [node("Erf", [node("Div", [h, init(f"{i}s2", np.array(np.sqrt(2.0)))])]), init(f"{i}one", np.array(1.0))])])
    x = node("LayerNormalization", [node("Add", [x, lin(g, "output.dense")]), init(f"{i}l2w", W[p + "output.LayerNorm.weight"]), init(f"{i}l2b", W[p + "output.LayerNorm.bias"])], epsilon=1e-12, axis=-1)
m3 = node("Unsqueeze", [maskf, const_i64("ax2", [2])])
summed = node("ReduceSum", [node("Mul", [x, m3]), const_i64("ax1", [1])], keepdims=0)
count = node("ReduceSum", [m3, const_i64("ax1b", [1])], keepdims=0)
mean = node("Div", [summed, count])
norm = node("Sqrt", [node("ReduceSum", [node("Mul", [mean, mean]), const_i64("axl", [1])], keepdims=1)])
node("Div", [mean, norm], out="embeddings")

graph = helper.make_graph(
    nodes, "minilm",
    [helper.make_tensor_value_info(n, TensorProto.INT64, ["B", "L"]) for n in ["input_ids", "position_ids", "attention_mask"]],
    [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["B", d])],
    inits,
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
so = ort.SessionOptions()
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
so.intra_op_num_threads = int(cfg["threads"])
so.inter_op_num_threads = 1
sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def feeds(batch):
    L = max(len(s) for s in batch)
    ids = np.zeros((len(batch), L), np.int64)
    mask = np.zeros((len(batch), L), np.int64)
    for r, s in enumerate(batch):
        ids[r, : len(s)] = s
        mask[r, : len(s)] = 1
    pos = np.tile(np.arange(L, dtype=np.int64), (len(batch), 1))
    return {"input_ids": ids, "position_ids": pos, "attention_mask": mask}


best = []
check = None
for bi, batch in enumerate(cfg["batches"]):
    f = feeds(batch)
    out = sess.run(None, f)[0]  # warm-up
    if bi == 0:
        check = out[0].tolist()
    # Seconds per call: the best of `reps` samples, each the mean of as many calls as make
    # about 64 sentences (as `cargo xtask bench embed` times its own side).
    calls = max(1, 64 // len(batch))
    t = float("inf")
    for _ in range(int(cfg["reps"])):
        t0 = time.perf_counter()
        for _ in range(calls):
            sess.run(None, f)
        t = min(t, (time.perf_counter() - t0) / calls)
    best.append(t)
print(json.dumps({"onnxruntime": ort.__version__, "seconds": best, "check": check}))
