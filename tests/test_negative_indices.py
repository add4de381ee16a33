"""``negative_indices=False``: the valid range is [0, s-1] and nothing wraps.

The reference is the NumPy loops of tests/reference.py with ``negative=False``
(the same loops BNNS is tested against), for every op that takes the option.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

import xgather
from tests import reference as ref
from tests.helpers import check_everywhere

RNG = np.random.default_rng(11)

# name: (op, static args, reference, data shape, indices shape, index bound per entry, tuples)
CASES = {
    "onnx.gather": (xgather.onnx.gather, dict(axis=1),
                    functools.partial(ref.gather, axis=1), (3, 5, 4), (2, 3), 5, False),
    "onnx.gather_nd": (xgather.onnx.gather_nd, dict(batch_dims=1),
                       functools.partial(ref.gather_nd, batch_dims=1), (3, 4, 5), (3, 2, 1), 4,
                       True),
    "onnx.gather_elements": (xgather.onnx.gather_elements, dict(axis=0),
                             functools.partial(ref.gather_elements, axis=0), (4, 3), (6, 3), 4,
                             False),
    "openvino.gather": (xgather.openvino.gather, dict(axis=1, batch_dims=1),
                        functools.partial(ref.gather, axis=1, batch_dims=1), (3, 6, 2), (3, 4),
                        6, False),
    "openvino.gather_nd": (xgather.openvino.gather_nd, dict(),
                           ref.gather_nd, (4, 5, 2), (3, 2), np.array([4, 5]), True),
    "openvino.gather_elements": (xgather.openvino.gather_elements, dict(axis=1),
                                 functools.partial(ref.gather_elements, axis=1), (3, 5), (3, 7),
                                 5, False),
    "labview.gather": (xgather.labview.gather, dict(axis=0),
                       functools.partial(ref.gather, axis=0), (6, 2), (4,), 6, False),
}


def arrays(name, negative: bool):
    _, _, _, dshape, ishape, bound, _ = CASES[name]
    data = RNG.standard_normal(dshape).astype(np.float32)
    lo = -np.asarray(bound) if negative else 0
    idx = RNG.integers(lo, bound, ishape)
    if negative:  # at least one negative entry, whatever the draw
        idx.reshape(-1)[0] = -1
    return data, idx


def bound_op(name, **kw):
    op, statics, *_ = CASES[name]
    return lambda d, i: op(d, i, **statics, **kw)


@pytest.mark.parametrize("mode", [None, "error", "clip", "fill", "promise_in_bounds"])
@pytest.mark.parametrize("name", CASES)
def test_nonnegative_indices_gather_as_the_spec_says(name, mode):
    data, idx = arrays(name, negative=False)
    f = bound_op(name, mode=mode, negative_indices=False)
    want = CASES[name][2]
    check_everywhere(f, data, idx, lambda d, i: want(d, i, negative=False), tuples=CASES[name][6])
    # and the same as the spec's rule, since nothing was negative
    check_everywhere(f, data, idx, lambda d, i: want(d, i), tuples=CASES[name][6])


@pytest.mark.parametrize("mode", ["clip", "fill"])
@pytest.mark.parametrize("name", CASES)
def test_negative_index_is_out_of_range(name, mode):
    data, idx = arrays(name, negative=True)
    want = CASES[name][2]
    f = bound_op(name, mode=mode, negative_indices=False, fill_value=-7.0) if mode == "fill" \
        else bound_op(name, mode=mode, negative_indices=False)
    check_everywhere(f, data, idx,
                     lambda d, i: want(d, i, negative=False, oob=mode, fill=-7.0),
                     tuples=CASES[name][6])


@pytest.mark.parametrize("name", CASES)
def test_negative_index_is_an_error(name):
    data, idx = arrays(name, negative=True)
    f = bound_op(name, mode="error", negative_indices=False)
    op = CASES[name][0]
    pattern = r"index -1 at indices\[0(, 0)*\] is out of range \[0, \d+\]"
    with pytest.raises(xgather.OutOfBoundsError, match=pattern):
        f(data, idx)
    with pytest.raises(xgather.OutOfBoundsError, match=pattern):
        xgather.checked(sync=True)(jax.jit(f))(data, idx)
    with pytest.raises(IndexError):
        CASES[name][2](data, idx, negative=False)  # the reference agrees
    plan = xgather.explain(op, data, idx, **CASES[name][1], negative_indices=False)
    assert plan.negative is False and "negative indices are out of range" in str(plan)


def test_openvino_gather_default_fills_a_negative_index():
    data, idx = arrays("openvino.gather", negative=True)
    got = xgather.openvino.gather(data, idx, 1, 1, negative_indices=False)
    np.testing.assert_array_equal(got, ref.gather(data, idx, 1, 1, negative=False, oob="fill"))


def test_gradient_of_a_clamped_negative_index_goes_to_row_zero():
    data = RNG.standard_normal((5, 3)).astype(np.float32)
    idx = np.array([-2, 4, 1, -1])
    ct = RNG.standard_normal((4, 3)).astype(np.float32)

    def f(d):
        return (xgather.onnx.gather(d, idx, 0, mode="clip", negative_indices=False) * ct).sum()

    want = ref.scatter_add_take(data.shape, idx, ct, negative=False, oob="clip")
    np.testing.assert_allclose(jax.grad(f)(data), want, rtol=1e-6)
    assert want[0].any() and not want[3].any()  # row 3 gets nothing: -2 did not wrap


@pytest.mark.parametrize("bad", [1, "no", None])
def test_negative_indices_must_be_a_bool(bad):
    with pytest.raises(xgather.XGatherError,
                       match=r"onnx\.Gather-13: negative_indices must be a bool; got"):
        xgather.onnx.gather(np.zeros(3), np.zeros(2, np.int64), negative_indices=bad)
