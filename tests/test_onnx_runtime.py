"""Differential tests against onnxruntime on Hypothesis-generated cases."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import xgather
from tests import ort_oracle
from tests.helpers import assert_same

DTYPES = [np.float32, np.int32, np.int64, np.float16, np.uint8, np.bool_]


@st.composite
def arrays(draw, shape):
    dtype = draw(st.sampled_from(DTYPES))
    size = int(np.prod(shape))
    seed = draw(st.integers(0, 2**31 - 1))
    values = np.random.default_rng(seed).integers(-100, 100, size)
    return values.astype(dtype).reshape(shape)


def _index_values(draw, shape, bounds):
    """Integers in [-s, s-1] per slot, ``bounds`` broadcast against ``shape``."""
    bounds = np.broadcast_to(np.asarray(bounds), shape)
    seed = draw(st.integers(0, 2**31 - 1))
    u = np.random.default_rng(seed).random(shape)
    idx = np.floor(u * 2 * bounds).astype(np.int64) - bounds
    return np.asarray(idx).astype(draw(st.sampled_from([np.int64, np.int32])))


shapes = st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple)


@st.composite
def gather_case(draw):
    shape = draw(shapes)
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    ishape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
    return draw(arrays(shape)), _index_values(draw, ishape, shape[axis]), axis


@given(gather_case(), st.sampled_from([1, 11, 13]))
def test_gather_vs_onnxruntime(case, opset):
    data, idx, axis = case
    want = ort_oracle.run("Gather", data, idx, opset=max(opset, 11), axis=axis)
    assert_same(xgather.onnx.gather(data, idx, axis, opset=opset), want)


@st.composite
def gather_nd_case(draw):
    shape = draw(shapes)
    b = draw(st.integers(0, len(shape) - 1))
    k = draw(st.integers(1, len(shape) - b))
    lead = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    ishape = shape[:b] + lead + (k,)
    return draw(arrays(shape)), _index_values(draw, ishape, shape[b:b + k]).astype(np.int64), b


@given(gather_nd_case())
def test_gather_nd_vs_onnxruntime(case):
    data, idx, b = case
    want = ort_oracle.run("GatherND", data, idx, opset=13, batch_dims=b)
    assert_same(xgather.onnx.gather_nd(data, idx, b), want)


@st.composite
def gather_elements_case(draw):
    shape = draw(shapes)
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    ishape = tuple(draw(st.integers(1, n)) if i != axis % len(shape) else draw(st.integers(0, 4))
                   for i, n in enumerate(shape))
    return draw(arrays(shape)), _index_values(draw, ishape, shape[axis]), axis


@given(gather_elements_case(), st.sampled_from([11, 13]))
def test_gather_elements_vs_onnxruntime(case, opset):
    data, idx, axis = case
    want = ort_oracle.run("GatherElements", data, idx, opset=opset, axis=axis)
    assert_same(xgather.onnx.gather_elements(data, idx, axis, opset=opset), want)


@pytest.mark.parametrize("op, data, idx, attrs", [
    ("Gather", np.arange(6.0, dtype=np.float32).reshape(2, 3), np.array([[0, 3]]), {"axis": 1}),
    ("Gather", np.arange(6.0, dtype=np.float32).reshape(2, 3), np.array([-3]), {"axis": 0}),
    ("GatherND", np.arange(6.0, dtype=np.float32).reshape(2, 3), np.array([[1, -4]]), {}),
    ("GatherElements", np.arange(6.0, dtype=np.float32).reshape(2, 3), np.array([[0, 3, 1]]),
     {"axis": 1}),
])
def test_out_of_range_is_an_error_in_both(op, data, idx, attrs):
    with pytest.raises(Exception, match="out of|bounds|range|invalid index"):
        ort_oracle.run(op, data, idx, **attrs)
    fn = {"Gather": xgather.onnx.gather, "GatherND": xgather.onnx.gather_nd,
          "GatherElements": xgather.onnx.gather_elements}[op]
    with pytest.raises(xgather.OutOfBoundsError, match=r"out of range \[-\d+, \d+\]"):
        fn(data, idx, **attrs)
