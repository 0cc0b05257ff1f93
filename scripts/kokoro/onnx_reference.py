"""Reference values for the Kokoro ONNX import (crates/sapient-kokoro/tests/onnx_import.rs).

Run in a venv outside the repository (numpy, onnx, onnxruntime):

    python scripts/kokoro/onnx_reference.py ~/.cache/sapient/models/kokoro-82m/kokoro-v1.0.int8.onnx \
        tests/data/kokoro/onnx_reference.json

Independent of sapient's graph following: scales are taken by the quantizer's naming
convention (`<weight>_scale`), zero points from the consuming op's input, and the
dequantization is run by onnxruntime's own DequantizeLinear on a one-node graph. The layout
changes (transpose of MatMul weights, LSTM gates i,o,f,c -> i,f,g,o) are applied in numpy.

It also runs one DynamicQuantizeLSTM node of the file (predictor.shared) through
onnxruntime on a fixed input, so that the test can check an LSTM written with PyTorch's
gate order over the imported weights against it.
"""
import json
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

src, dst = sys.argv[1], sys.argv[2]
m = onnx.load(src)
g = m.graph
inits = {t.name: t for t in g.initializer}
arr = lambda n: numpy_helper.to_array(inits[n])


def node_using(name, op):
    for n in g.node:
        if n.op_type == op and name in n.input:
            return n
    raise SystemExit(f"no {op} uses {name}")


def ort_dequantize(q, scale, zp, axis):
    """onnxruntime's DequantizeLinear on one node."""
    qt = {np.int8: TensorProto.INT8, np.uint8: TensorProto.UINT8}[q.dtype.type]
    node = helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=axis)
    graph = helper.make_graph(
        [node], "dq",
        [helper.make_tensor_value_info("q", qt, list(q.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(scale.astype(np.float32), "s"), numpy_helper.from_array(zp, "z")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 9
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    y = sess.run(None, {"q": q})[0]
    # the same in numpy, as a cross-check of the formula (q - zp) * scale
    shape = [1] * q.ndim
    if scale.size > 1:
        shape[axis] = scale.size
    ref = (q.astype(np.int32) - zp.astype(np.int32).reshape(shape)).astype(np.float32) * scale.reshape(shape).astype(np.float32)
    assert np.array_equal(y, ref), "onnxruntime and numpy disagree"
    return y


def gates(w, h):
    """rows in ONNX gate order (i, o, f, c) -> PyTorch (i, f, g, o)"""
    i, o, f, c = (w[k * h:(k + 1) * h] for k in range(4))
    return np.concatenate([i, f, c, o])


out = {}


def record(name, t):
    t = np.ascontiguousarray(t, dtype=np.float32)
    flat = t.reshape(-1)
    n = flat.size
    idx = sorted(set([0, n - 1] + [n * k // 7 for k in range(1, 7)]))
    out[name] = {
        "shape": list(t.shape),
        "sum": float(flat.astype(np.float64).sum()),
        "sum_sq": float((flat.astype(np.float64) ** 2).sum()),
        "samples": [[i, float(flat[i])] for i in idx],
    }


def matmul_weight(q_name):
    q = arr(q_name)
    base = q_name[: -len("_quantized")]
    n = node_using(q_name, "MatMulInteger")
    zp = arr(n.input[3])
    return ort_dequantize(q, arr(base + "_scale"), zp, 1).T


def conv_weight(q_name):
    q = arr(q_name)
    base = q_name[: -len("_quantized")]
    n = node_using(q_name, "ConvInteger")
    zp = arr(n.input[3])
    return ort_dequantize(q, arr(base + "_scale"), zp, 0)


# MatMulInteger, onnx::-named, per-column scale (ALBERT's FFN, shared by 12 layers)
record("bert.encoder.albert_layer_groups.0.albert_layers.0.ffn.weight", matmul_weight("onnx::MatMul_6559_3_quantized"))
# MatMulInteger under its PyTorch name, per-column zero point
record("decoder.generator.resblocks.4.adain2.2.fc.weight",
       matmul_weight("decoder.decoder.generator.resblocks.4.adain2.2.fc.weight_quantized"))
# linear of the duration head (per-column zero point, [512, 50] in the file)
record("predictor.duration_proj.linear_layer.weight", matmul_weight("onnx::MatMul_6886_quantized"))
# ConvInteger, graph-path named (weight norm folded), uint8 per tensor; its zero point is a
# deduplicated initializer of another conv
record("predictor.F0.1.conv1.weight", conv_weight("/encoder/F0.1/Mul_1_output_0_quantized"))
record("decoder.decode.0.conv1.weight", conv_weight("/decoder/decoder/decode.0/Mul_output_0_quantized"))
record("predictor.F0.1.conv1x1.weight", conv_weight("/encoder/F0.1/Mul_3_output_0_quantized"))
record("decoder.generator.noise_convs.0.weight", conv_weight("decoder.decoder.generator.noise_convs.0.weight_quantized"))
# DequantizeLinear after Gather: the embedding tables
dq = node_using("encoder.bert.embeddings.word_embeddings.weight_scale", "DequantizeLinear")
record("bert.embeddings.word_embeddings.weight",
       ort_dequantize(arr("encoder.bert.embeddings.word_embeddings.weight_quantized"),
                      arr(dq.input[1]), arr(dq.input[2]), 1))
# DynamicQuantizeLSTM: predictor.shared (W [2, 640, 1024], R [2, 256, 1024], B [2, 2048])
lstm = [n for n in g.node if n.op_type == "DynamicQuantizeLSTM" and n.name.startswith("/encoder/shared/")][0]
H = 256
W = ort_dequantize(arr(lstm.input[1]), arr(lstm.input[8]), arr(lstm.input[9]), 0)
R = ort_dequantize(arr(lstm.input[2]), arr(lstm.input[10]), arr(lstm.input[11]), 0)
B = arr(lstm.input[3])
record("predictor.shared.weight_ih_l0", gates(W[0].T, H))
record("predictor.shared.weight_hh_l0_reverse", gates(R[1].T, H))
record("predictor.shared.bias_ih_l0", gates(B[0, :4 * H], H))
record("predictor.shared.bias_hh_l0_reverse", gates(B[1, 4 * H:], H))
# float tensors: a graph-path ConvTranspose weight, a transposed float MatMul, a kept name
record("decoder.generator.ups.0.weight", arr("/decoder/decoder/generator/Mul_output_0"))
record("decoder.generator.m_source.l_linear.weight", arr("onnx::MatMul_6993").T)
record("text_encoder.cnn.0.1.gamma", arr("encoder.text_encoder.cnn.0.1.gamma"))

# One DynamicQuantizeLSTM node run by onnxruntime: X [T, 1, 640] = sin(0.37 * (t * 640 + k))
T, I = 6, 640
X = np.sin(0.37 * np.arange(T * I, dtype=np.float64)).astype(np.float32).reshape(T, 1, I)
node = helper.make_node("DynamicQuantizeLSTM", ["X", "W", "R", "B", "", "", "", "", "ws", "wz", "rs", "rz"], ["Y"],
                        domain="com.microsoft", direction="bidirectional", hidden_size=H)
names = ["W", "R", "B", "ws", "wz", "rs", "rz"]
tensors = [numpy_helper.from_array(arr(lstm.input[k]), nm) for k, nm in zip([1, 2, 3, 8, 9, 10, 11], names)]
graph = helper.make_graph([node], "lstm", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [T, 1, I])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], tensors)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)])
model.ir_version = 9
Y = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": X})[0]
# Y: [T, 2, 1, H]

# The same LSTM in float with PyTorch's gate order over the dequantized weights: how far the
# dynamic quantization of the activations puts onnxruntime from a float LSTM.
def torch_lstm(x, wih, whh, bih, bhh, reverse):
    h = np.zeros(H, np.float64); c = np.zeros(H, np.float64); ys = [None] * len(x)
    order = range(len(x) - 1, -1, -1) if reverse else range(len(x))
    for t in order:
        z = wih @ x[t] + bih + whh @ h + bhh
        i, f, gg, o = (z[k * H:(k + 1) * H] for k in range(4))
        sig = lambda v: 1 / (1 + np.exp(-v))
        c = sig(f) * c + sig(i) * np.tanh(gg)
        h = sig(o) * np.tanh(c)
        ys[t] = h
    return np.stack(ys)

float_y = np.stack([
    torch_lstm(X[:, 0].astype(np.float64), gates(W[d].T, H), gates(R[d].T, H),
               gates(B[d, :4 * H], H), gates(B[d, 4 * H:], H), d == 1) for d in range(2)], axis=1)
max_diff = float(np.abs(float_y - Y[:, :, 0]).max())
print("float LSTM (PyTorch gates) vs onnxruntime DynamicQuantizeLSTM: max |diff|", max_diff)
out["__lstm_predictor.shared"] = {
    "T": T, "input_size": I, "hidden": H,
    "x": "sin(0.37 * (t * input_size + k))",
    "y": [float(v) for v in Y.reshape(-1)],
    "y_shape": list(Y.shape),
    "float_reference_max_abs_diff": max_diff,
}

with open(dst, "w") as f:
    json.dump({"onnx_sha256": "6e742170d309016e5891a994e1ce1559c702a2ccd0075e67ef7157974f6406cb",
               "onnxruntime": ort.__version__, "tensors": out}, f, indent=1)
print("wrote", dst, len(out), "entries")
