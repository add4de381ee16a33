"""One-node ONNX models run by onnxruntime: an independent oracle."""

from __future__ import annotations

import functools

import numpy as np
from onnx import helper

onnxruntime = __import__("pytest").importorskip("onnxruntime")


@functools.lru_cache(maxsize=256)
def _session(op: str, opset: int, dtype: str, idx_dtype: str, data_rank: int, idx_rank: int,
             attrs: tuple):
    node = helper.make_node(op, ["data", "indices"], ["out"], **dict(attrs))
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("data", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                                       [None] * data_rank),
         helper.make_tensor_value_info("indices",
                                       helper.np_dtype_to_tensor_dtype(np.dtype(idx_dtype)),
                                       [None] * idx_rank)],
        [helper.make_tensor_value_info("out", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                                       None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=8)
    return onnxruntime.InferenceSession(model.SerializeToString(),
                                        providers=["CPUExecutionProvider"])


def run(op: str, data, indices, opset: int = 13, **attrs):
    data, indices = np.asarray(data), np.asarray(indices)
    sess = _session(op, opset, data.dtype.str, indices.dtype.str, data.ndim, indices.ndim,
                    tuple(sorted(attrs.items())))
    return sess.run(None, {"data": data, "indices": indices})[0]
