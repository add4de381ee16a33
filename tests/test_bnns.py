"""Apple BNNS gathers: the spec's examples, the NumPy reference, the chosen index rules."""

from __future__ import annotations

import numpy as np
import pytest

import xgather
from tests import reference as ref
from tests.helpers import assert_same, check_everywhere

bnns = xgather.bnns
# bnns-gathernd.txt: shape .tensor3DFirstMajor(3, 2, 2)
VALUES = np.array([10, 11, 12, 13, 20, 21, 22, 23, 30, 31, 32, 33], np.float32).reshape(3, 2, 2)


@pytest.mark.parametrize("indices, want", [
    (np.array([1], np.int32), np.array([[20, 21], [22, 23]], np.float32)),  # .vector(1)
    (np.array([[1, 0]], np.int32), np.array([[20, 21]], np.float32)),  # .matrixFirstMajor(1, 2)
    (np.array([[[1, 1, 1]]], np.int32), np.array([[23]], np.float32)),  # .tensor3DFirstMajor(1,1,3)
], ids=["scalar-index-2d-slice", "2d-index-1d-slice", "3d-index-element"])
def test_spec_examples(indices, want):
    assert_same(bnns.gather_nd(VALUES, indices), want)
    assert_same(bnns.gather_nd(VALUES, indices.astype(np.int64)), want)


@pytest.mark.parametrize("b", [0, 1, 2])
def test_gather_nd_batch_dimension_count(b):
    rng = np.random.default_rng(b)
    data = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    k = 4 - b - 1
    idx = np.stack([rng.integers(0, data.shape[b + j], (2, 3, 2)[:b] + (3,)) for j in range(k)],
                   -1).astype(np.int32)
    check_everywhere(lambda d, i: bnns.gather_nd(d, i, b), data, idx,
                     lambda d, i: ref.gather_nd(d, i, b), tuples=True)


@pytest.mark.parametrize("axis, b", [(0, 0), (1, 0), (1, 1), (2, 1), (2, 2), (-1, 2)])
def test_gather_with_batch_dimension_count(axis, b):
    rng = np.random.default_rng(7)
    data = rng.standard_normal((2, 3, 4)).astype(np.float32)
    s = data.shape[axis]
    idx = rng.integers(0, s, (2, 3)[:b] + (2, 2)).astype(np.int32)
    check_everywhere(lambda d, i: bnns.gather(d, i, axis, b), data, idx,
                     lambda d, i: ref.gather(d, i, axis, b, negative=False))


def test_gather_along_axis_is_take_along_axis():
    rng = np.random.default_rng(3)
    data = rng.standard_normal((3, 4, 5)).astype(np.float32)
    idx = rng.integers(0, 4, (3, 7, 5)).astype(np.int64)
    check_everywhere(lambda d, i: bnns.gather_along_axis(d, i, 1), data, idx,
                     lambda d, i: ref.gather_elements(d, i, 1, negative=False))
    assert_same(bnns.gather_along_axis(data, idx, 1), np.take_along_axis(data, idx, 1))


def test_negative_indices_are_out_of_range():
    with pytest.raises(xgather.OutOfBoundsError,
                       match=r"^bnns\.GatherND: index -1 at indices\[0\] is out of range \[0, 2\] "
                             r"for data axis 0 of size 3"):
        bnns.gather_nd(VALUES, np.array([-1], np.int32))
    assert_same(bnns.gather_nd(VALUES, np.array([[-1, 5]], np.int32), mode="clip"),
                ref.gather_nd(VALUES, np.array([[-1, 5]]), negative=False, oob="clip"))
    assert_same(bnns.gather(VALUES, np.array([-1, 1], np.int32), 0, mode="fill", fill_value=9),
                ref.gather(VALUES, np.array([-1, 1]), 0, negative=False, oob="fill", fill=9))


def test_bad_inputs():
    with pytest.raises(xgather.XGatherTypeError, match=r"bnns\.GatherND: indices must be int32"):
        bnns.gather_nd(VALUES, np.array([1], np.int16))
    with pytest.raises(xgather.XGatherError,
                       match=r"bnns\.GatherND: indices\.shape\[-1\] must be in "
                             r"\[1, data\.ndim - batch_dimension_count = 3\]"):
        bnns.gather_nd(VALUES, np.zeros((1, 4), np.int32))
    with pytest.raises(xgather.XGatherError, match=r"bnns\.Gather: batch_dimension_count \(1\) "
                                                    r"must be <= "
                                                    r"axis \(0\)"):
        bnns.gather(VALUES, np.zeros((3, 1), np.int32), 0, 1)
    with pytest.raises(xgather.XGatherError, match=r"bnns\.GatherAlongAxis: indices\.shape\[0\] "
                                                    r"must be == data\.shape\[0\]"):
        bnns.gather_along_axis(VALUES, np.zeros((2, 2, 2), np.int32), 1)


def test_errors_name_the_batch_dimension_count_as_bnns_does():
    x, i = np.zeros((3, 2, 2), np.float32), np.array([[1], [0], [1]], np.int32)
    for call, message in [
            (lambda: xgather.bnns.gather_nd(x, i, batch_dimension_count=-1),
             r"bnns\.GatherND: batch_dimension_count must be a non-negative int; "
             r"got batch_dimension_count=-1"),
            (lambda: xgather.bnns.gather_nd(x, i, batch_dimension_count=2),
             r"batch_dimension_count must be < min\(data\.ndim, indices\.ndim\) = 2"),
            (lambda: xgather.bnns.gather(x, i, 1, batch_dimension_count=-1),
             r"bnns\.Gather: batch_dimension_count must be in \[0, indices\.ndim=2\]"),
            (lambda: xgather.bnns.gather(x, i, 1, batch_dimension_count=2),
             r"batch_dimension_count \(2\) must be <= axis \(1\)")]:
        with pytest.raises(xgather.XGatherError, match=message):
            call()
