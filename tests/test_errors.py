"""Bad inputs: the exception type and the message (op, rule, values, shapes)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

import xgather
from xgather import OutOfBoundsError, XGatherError, XGatherTypeError

G, ND, EL = xgather.onnx.gather, xgather.onnx.gather_nd, xgather.onnx.gather_elements
D = np.zeros((2, 3, 4), np.float32)
I64 = np.zeros((2,), np.int64)

BAD = [
    ("axis-too-big", G, (D, I64, 3), {}, XGatherError,
     r"^onnx\.Gather-13: axis must be in \[-3, 2\] for data of rank 3; got axis=3 "
     r"\[data\.shape=\(2, 3, 4\), indices\.shape=\(2,\)\]"),
    ("axis-too-small", EL, (D, np.zeros((2, 3, 4), np.int64), -4), {}, XGatherError,
     r"onnx\.GatherElements-13: axis must be in \[-3, 2\]"),
    ("axis-not-int", G, (D, I64, 1.0), {}, XGatherError, r"axis must be a Python int"),
    ("batch-dims-too-big", ND, (D, np.zeros((2, 3), np.int64), 2), {}, XGatherError,
     r"onnx\.GatherND-13: batch_dims must be < min\(data\.ndim, indices\.ndim\) = 2; "
     r"got batch_dims=2 \[data\.shape=\(2, 3, 4\), indices\.shape=\(2, 3\)\]"),
    ("batch-dims-negative", ND, (D, np.zeros((2, 1), np.int64), -1), {}, XGatherError,
     r"batch_dims must be a non-negative int; got batch_dims=-1"),
    ("batch-dims-opset11", ND, (D, np.zeros((2, 1), np.int64), 1), {"opset": 11}, XGatherError,
     r"onnx\.GatherND-11: batch_dims exists from opset 12 on; got batch_dims=1"),
    ("tuple-longer-than-rank", ND, (D, np.zeros((2, 3), np.int64), 1), {}, XGatherError,
     r"indices\.shape\[-1\] must be in \[1, data\.ndim - batch_dims = 2\]; "
     r"got indices\.shape\[-1\]=3"),
    ("empty-tuple", ND, (D, np.zeros((5, 0), np.int64)), {}, XGatherError,
     r"indices\.shape\[-1\] must be in \[1, data\.ndim - batch_dims = 3\]; "
     r"got indices\.shape\[-1\]=0"),
    # onnxruntime accepts this (equal products 6 == 6); the spec asks for equal dims.
    ("batch-shape-mismatch", ND, (D, np.zeros((3, 2, 1), np.int64), 2), {}, XGatherError,
     r"the first batch_dims=2 dimensions of data and indices must be equal; "
     r"got \(2, 3\) and \(3, 2\)"),
    ("scalar-indices-nd", ND, (D, np.int64(0)), {}, XGatherError,
     r"onnx\.GatherND-13: indices must have rank >= 1"),
    ("float-indices", G, (D, np.zeros(2, np.float32)), {}, XGatherTypeError,
     r"^onnx\.Gather-13: indices must be int32 or int64; got float32"),
    ("bool-indices", ND, (D, np.zeros((1, 1), bool)), {}, XGatherTypeError,
     r"onnx\.GatherND-13: indices must be int32 or int64; got bool"),
    ("int8-indices", EL, (D, np.zeros((2, 3, 4), np.int8)), {}, XGatherTypeError,
     r"indices must be int32 or int64; got int8"),
    ("float-list-indices", G, (D, np.asarray([0.5])), {}, XGatherTypeError, r"got float(32|64)"),
    ("opset-before-op", ND, (D, np.zeros((2, 1), np.int64)), {"opset": 10}, XGatherError,
     r"^onnx\.GatherND: GatherND exists from opset 11 on; got opset=10"),
    ("opset-not-int", G, (D, I64), {"opset": "13"}, XGatherError,
     r"^onnx\.Gather: opset must be an int \(the model's opset_import version\); got '13'"),
    ("unknown-mode", G, (D, I64), {"mode": "wrap"}, XGatherError,
     r"mode must be one of 'error', 'clip', 'fill', 'promise_in_bounds'; got 'wrap'"),
    ("elements-rank", EL, (D, np.zeros((2, 3), np.int64)), {}, XGatherError,
     r"indices must have the same rank as data \(3\); got rank 2"),
    ("elements-larger-off-axis", EL, (D, np.zeros((2, 4, 4), np.int64), 0), {}, XGatherError,
     r"indices\.shape\[1\] must be <= data\.shape\[1\] off the gather axis; got 4 vs 3"),
    ("scalar-data", G, (np.float32(1), I64), {}, XGatherError, r"data must have rank >= 1"),
    ("oob", G, (D, np.array([[0, 1], [2, 5]]), 1), {}, OutOfBoundsError,
     r"^onnx\.Gather-13: index 5 at indices\[1, 1\] is out of range \[-3, 2\] "
     r"for data axis 1 of size 3 \(1 out-of-range value\(s\) in indices\)$"),
    ("negative-oob", G, (D, np.array([-3, -4, 9]), 2), {}, OutOfBoundsError,
     r"index -5 at|index 9 at"),
    ("nd-oob-component", ND, (D, np.array([[1, 0], [1, -4]])), {}, OutOfBoundsError,
     r"onnx\.GatherND-13: index -4 at indices\[1, 1\] is out of range \[-3, 2\] "
     r"for data axis 1 of size 3"),
    ("elements-oob", EL, (D, np.full((2, 3, 1), -5), 2), {}, OutOfBoundsError,
     r"index -5 at indices\[0, 0, 0\] is out of range \[-4, 3\] .* \(6 out-of-range"),
    ("empty-axis", G, (np.zeros((2, 0)), np.array([0]), 1), {}, OutOfBoundsError,
     r"index 0 at indices\[0\] is out of range \[-0, -1\] for data axis 1 of size 0"),
]
BAD[21] = ("negative-oob", G, (D, np.array([-3, -5, 9]), 2), {}, OutOfBoundsError,
           r"^onnx\.Gather-13: index -5 at indices\[1\] is out of range \[-4, 3\] "
           r"for data axis 2 of size 4 \(2 out-of-range")


@pytest.mark.parametrize("fn, args, kwargs, exc, pattern",
                         [pytest.param(*b[1:], id=b[0]) for b in BAD])
def test_bad_input_eagerly(fn, args, kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        fn(*args, **kwargs)


@pytest.mark.parametrize("fn, args, kwargs, exc, pattern",
                         [pytest.param(*b[1:], id=b[0]) for b in BAD])
def test_bad_input_under_checked_jit(fn, args, kwargs, exc, pattern):
    arrays = [a for a in args if isinstance(a, np.ndarray | np.generic)]
    statics = args[len(arrays):]
    f = xgather.checked(jax.jit(lambda d, i: fn(d, i, *statics, **kwargs)))
    with pytest.raises(exc, match=pattern):
        f(*arrays)


def test_jit_without_checked_names_both_remedies():
    with pytest.raises(XGatherError, match=r"onnx\.Gather-13: .*xgather\.checked\(f\).*"
                                           r"mode=\"clip\", \"fill\" or \"promise_in_bounds\""):
        jax.jit(lambda d, i: G(d, i))(D, I64)


def test_plain_checkify_functionalises_the_check():
    f = checkify.checkify(jax.jit(lambda d, i: ND(d, i)), errors=checkify.user_checks)
    err, _ = f(D, np.array([[0, 7]]))
    assert "index 7 at indices[0, 1] is out of range [-3, 2]" in err.get()
    err, out = f(D, np.array([[1, -1]]))
    assert err.get() is None
    np.testing.assert_array_equal(out, D[1, 2][None])


def test_error_classes_are_standard_exceptions():
    assert issubclass(XGatherError, ValueError)
    assert issubclass(XGatherTypeError, TypeError)
    assert issubclass(OutOfBoundsError, IndexError)


# Large index arrays take the blocked flag and the branch-guarded report
# (xgather._modes._EAGER_REPORT); the first bad index and the count must come out
# the same wherever it lies: in the first block, mid-array, or in the ragged tail.
@pytest.mark.parametrize("shape", [(32768,), (33000,), (3, 41, 997)])
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_large_index_arrays_report_the_first_bad_index(shape, where):
    rng = np.random.default_rng(7)
    data = np.arange(10, dtype=np.float32)
    idx = rng.integers(-10, 10, shape)
    n = idx.size
    at = {"first": [0], "middle": [n // 2 + 5, n - 3], "last": [n - 1]}[where]
    flat = idx.reshape(-1)
    for k, p in enumerate(at):
        flat[p] = 10 + k if k % 2 == 0 else -11 - k
    pos = ", ".join(str(int(q)) for q in np.unravel_index(at[0], shape))
    pattern = (rf"^onnx\.Gather-13: index {flat[at[0]]} at indices\[{pos}\] is out of range "
               rf"\[-10, 9\] for data axis 0 of size 10 \({len(at)} out-of-range")
    f = xgather.checked(jax.jit(lambda d, i: G(d, i, 0)))
    with pytest.raises(OutOfBoundsError, match=pattern):
        f(data, idx.astype(np.int32))
    with pytest.raises(OutOfBoundsError, match=pattern):
        G(data, idx)  # concrete indices: the host check
    good = np.where((flat < -10) | (flat >= 10), 3, flat).reshape(shape)
    np.testing.assert_array_equal(f(data, good.astype(np.int32)), data[good])


# The flag takes one form per size on XLA:CPU (xgather._modes._any and XLA's own choice):
# one unrolled max up to a few dozen values, loops up to 4095 beside small gathers (rows of
# 2 here), padded to 4096 beside large ones (rows of 512), the library max up to
# _EAGER_REPORT, blocked above. A single bad value at either end must be caught by each, on
# every path.
@pytest.mark.parametrize("n, width", [(1, 2), (32, 2), (33, 2), (4095, 2), (33, 512),
                                      (4095, 512), (4096, 2), (32769, 2)])
@pytest.mark.parametrize("where", ["first", "last"])
def test_every_flag_form_catches_one_bad_index(n, width, where):
    data = np.arange(6 * width, dtype=np.float32).reshape(6, width)
    idx = np.zeros((n, 1), np.int32)  # GatherND tuples of one component: n values
    p = 0 if where == "first" else n - 1
    idx[p, 0] = 6
    want = rf"^onnx\.GatherND-13: index 6 at indices\[{p}, 0\] is out of range \[-6, 5\]"
    f = xgather.checked(jax.jit(lambda d, i: xgather.onnx.gather_nd(d, i)))
    program = jax.make_jaxpr(checkify.checkify(lambda d, i: xgather.onnx.gather_nd(d, i)))
    padded = "pad[" in str(program(data, idx))
    # Above 32768 the blocks leave 1025 values, padded beside a large gather (65538 values).
    assert padded == ((width == 512 and 32 < n < 4096) or n > 32768)
    said = str(xgather.explain(xgather.onnx.gather_nd, data, idx)).splitlines()[-1]
    assert said.startswith('  bound check (mode="error"): a float32 max over the '
                           f"{n} index values") and ("padded to 4096" in said) == padded
    assert ("blocks first" in said) == (n > 32768)
    for call in (lambda: f(data, idx), lambda: xgather.onnx.gather_nd(data, jnp.asarray(idx))):
        with pytest.raises(OutOfBoundsError, match=want):
            call()
    idx[p, 0] = -1  # in range: wraps to row 5
    np.testing.assert_array_equal(f(data, idx), data[np.where(idx[:, 0] < 0, 5, idx[:, 0])])
