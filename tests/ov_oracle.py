"""One-op OpenVINO models compiled on CPU: an independent oracle.

Known faults of the CPU plugin kept out of the oracle (not copied): it
truncates 64-bit data to 32 bits, crashes on statically empty tensors, returns
stray values for out-of-range GatherND indices, zeroes negative indices in
Gather-1/7 (whose reference kernel wraps them), and crashes (SIGSEGV) on
out-of-range Gather-7 indices with batch_dims and on Gather with a batch
dimension of size 1 (data (1, 3), indices (1, 2), axis 1, batch_dims 1).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

ov = pytest.importorskip("openvino")
opset1 = pytest.importorskip("openvino.opset1")
_OPSETS = {n: __import__(f"openvino.opset{n}", fromlist=["x"]) for n in (1, 5, 6, 7, 8)}
_CORE = ov.Core()


@functools.lru_cache(maxsize=256)
def _compiled(kind: str, version: int, dshape, dtype, ishape, itype, attrs):
    attrs = dict(attrs)
    pd = opset1.parameter(list(dshape), ov.Type(np.dtype(dtype)))
    pi = opset1.parameter(list(ishape), ov.Type(np.dtype(itype)))
    ops = _OPSETS[version]
    if kind == "Gather":
        axis = opset1.constant(np.int64(attrs["axis"]))
        node = (ops.gather(pd, pi, axis) if version == 1
                else ops.gather(pd, pi, axis, attrs.get("batch_dims", 0)))
    elif kind == "GatherND":
        node = ops.gather_nd(pd, pi, attrs.get("batch_dims", 0))
    else:
        node = ops.gather_elements(pd, pi, attrs["axis"])
    return _CORE.compile_model(ov.Model([node], [pd, pi]), "CPU")


def run(kind: str, version: int, data, indices, **attrs):
    data, indices = np.asarray(data), np.asarray(indices)
    assert data.dtype.itemsize <= 4 and data.size and indices.size, "outside the oracle's range"
    model = _compiled(kind, version, data.shape, data.dtype.str, indices.shape,
                      indices.dtype.str, tuple(sorted(attrs.items())))
    return np.asarray(model([data, indices])[0])
