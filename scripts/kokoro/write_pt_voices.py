#!/usr/bin/env python3
"""Small PyTorch-format voice packs for crates/sapient-kokoro/tests/voices.rs, written without
torch (it is not installable here): the archive torch.save produces (zip, stored entries
`<stem>/data.pkl`, `<stem>/data/<key>`, `<stem>/byteorder`, `<stem>/version`), with the pickle
(protocol 2) it writes for a tensor: `torch._utils._rebuild_tensor_v2(storage, offset, size,
stride, requires_grad, OrderedDict())`, the storage a persistent id
`('storage', torch.FloatStorage, key, 'cpu', numel)`.

    python3 scripts/kokoro/write_pt_voices.py crates/sapient-kokoro/tests/data

writes `pt_bare.pt` (one [5, 1, 4] f32 tensor, as hexgrad/Kokoro-82M's voices/*.pt) and
`pt_dict.pt` ({'af_one': [5, 1, 4], 'am_two': [5, 1, 4]}); value i of a pack is
`base + i / 8` (base 0 for the bare one and af_one, 100 for am_two).
"""
import collections, io, os, pickle, struct, sys, types, zipfile

torch = types.ModuleType("torch")
utils = types.ModuleType("torch._utils")


def _rebuild_tensor_v2(*args):
    raise RuntimeError("only for pickling")


_rebuild_tensor_v2.__module__ = "torch._utils"
_rebuild_tensor_v2.__qualname__ = "_rebuild_tensor_v2"
utils._rebuild_tensor_v2 = _rebuild_tensor_v2


class FloatStorage:
    pass


FloatStorage.__module__ = "torch"
torch.FloatStorage = FloatStorage
torch._utils = utils
sys.modules["torch"] = torch
sys.modules["torch._utils"] = utils


class Storage:
    def __init__(self, key, values):
        self.key, self.values = key, values


class Tensor:
    def __init__(self, storage, shape):
        self.storage, self.shape = storage, shape

    def __reduce_ex__(self, protocol):
        stride, acc = [], 1
        for d in reversed(self.shape):
            stride.insert(0, acc)
            acc *= d
        return (_rebuild_tensor_v2, (self.storage, 0, tuple(self.shape), tuple(stride), False, collections.OrderedDict()))


class Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            return ("storage", FloatStorage, obj.key, "cpu", len(obj.values))
        return None


def save(obj, storages, path):
    stem = os.path.splitext(os.path.basename(path))[0]
    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump(obj)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{stem}/data.pkl", buf.getvalue())
        z.writestr(f"{stem}/byteorder", "little")
        for s in storages:
            z.writestr(f"{stem}/data/{s.key}", struct.pack(f"<{len(s.values)}f", *s.values))
        z.writestr(f"{stem}/version", "3\n")


def pack(key, base):
    s = Storage(key, [base + i / 8 for i in range(5 * 1 * 4)])
    return s, Tensor(s, [5, 1, 4])


out = sys.argv[1]
s, t = pack("0", 0.0)
save(t, [s], os.path.join(out, "pt_bare.pt"))
s1, t1 = pack("0", 0.0)
s2, t2 = pack("1", 100.0)
save(collections.OrderedDict([("af_one", t1), ("am_two", t2)]), [s1, s2], os.path.join(out, "pt_dict.pt"))
