"""Bad inputs: the exception type and the message (op, rule, values, shapes)."""

from __future__ import annotations

import pathlib
import re

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
    ("axis-not-int", G, (D, I64, 1.0), {}, XGatherError, r"axis must be an int"),
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
     r"index 0 at indices\[0\] is out of range: data axis 1 has size 0, so no index is in range"),
    ("nd-empty-axis", ND, (np.zeros((3, 0, 2)), np.array([[5, 0]])), {}, OutOfBoundsError,
     r"index 5 at indices\[0, 0\] is out of range for data axis 0 of size 3: data axis 1 has "
     r"size 0, so no index tuple is in range \(2 out-of-range"),
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
    f = xgather.checked(sync=True)(jax.jit(lambda d, i: fn(d, i, *statics, **kwargs)))
    if exc is OutOfBoundsError:  # the report, then where the gather was traced, and the call
        source = pathlib.Path(__file__).read_text().splitlines()
        line = next(n for n, text in enumerate(source, 1) if "fn(d, i, *statics, **kw" in text)
        line = f"{re.escape(__file__)}:{line}"
        pattern = (pattern.removesuffix("$") + ("" if pattern.endswith("$") else ".*")
                   + f"; the gather was traced at {line}\n"
                   r"  in call 1 of xgather\.checked\(test_bad_input_under_checked_jit\.<locals>"
                   r"\.<lambda>\)$")
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


# Large index arrays: the eager flag's blocks (xgather._indices._BLOCKED_ABOVE) and the traced
# check's one reduction; the first bad index and the count must come out the same
# wherever it lies: in the first block, mid-array, or in the ragged tail.
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
    f = xgather.checked(sync=True)(jax.jit(lambda d, i: G(d, i, 0)))
    with pytest.raises(OutOfBoundsError, match=pattern):
        f(data, idx.astype(np.int32))
    with pytest.raises(OutOfBoundsError, match=pattern):
        G(data, idx)  # concrete indices: the host check
    good = np.where((flat < -10) | (flat >= 10), 3, flat).reshape(shape)
    np.testing.assert_array_equal(f(data, good.astype(np.int32)), data[good])


# The flag takes one form per size on XLA:CPU (xgather._indices.any_true and XLA's own choice):
# one unrolled max up to a few dozen values, jnp.any up to 4095 beside small gathers (rows
# of 2 here), padded to 4096 beside large ones (rows of 512), the library max up to
# _BLOCKED_ABOVE, blocked above. A single bad value at either end must be caught by each, on
# every path.
@pytest.mark.parametrize("n, width", [(1, 2), (32, 2), (33, 2), (4095, 2), (33, 512),
                                      (4095, 512), (4096, 2), (32769, 2)])
@pytest.mark.parametrize("where", ["first", "last"])
def test_every_flag_form_catches_one_bad_index(n, width, where):
    from xgather import _apply, _gather
    data = np.arange(6 * width, dtype=np.float32).reshape(6, width)
    idx = np.zeros((n, 1), np.int32)  # GatherND tuples of one component: n values
    p = 0 if where == "first" else n - 1
    idx[p, 0] = 6
    want = rf"^onnx\.GatherND-13: index 6 at indices\[{p}, 0\] is out of range \[-6, 5\]"
    f = xgather.checked(sync=True)(jax.jit(lambda d, i: xgather.onnx.gather_nd(d, i)))
    # Traced: one variadic reduction (the count and the first bad position), no other.
    traced = str(jax.make_jaxpr(checkify.checkify(
        lambda d, i: xgather.onnx.gather_nd(d, i)))(data, idx))
    assert "reduce[" in traced and "reduce_max" not in traced and "reduce_or" not in traced
    # Eager device indices: the flag in the backend's form.
    plan = xgather.explain(xgather.onnx.gather_nd, data, idx)
    flagged = _apply.program(_gather.Call(plan, "promise_in_bounds"), True)
    program = str(jax.make_jaxpr(flagged)(data, idx))
    padded = "pad[" in program
    # Above 32768 the blocks leave 1025 values, padded beside a large gather (65538 values).
    # The jaxpr holds the form of the plan's backend (JAX's default): on XLA:CPU, the max.
    cpu = jax.default_backend() == "cpu"
    assert padded == (cpu and ((width == 512 and 32 < n < 4096) or n > 32768))
    said = next(line for line in str(plan).splitlines() if line.startswith("  bound check"))
    assert said.startswith('  bound check (mode="error"): under a transformation, one '
                           f"reduction over the {n} index values counts the bad ones and "
                           "finds the first; on device indices eagerly, ")
    boolean = not cpu or (width == 2 and 32 < n < 4096)  # off XLA:CPU, or unpadded there
    if boolean:
        assert said.endswith(f"eagerly, jnp.any over the {n} index values")
        assert "reduce_or" in program and "reduce_max" not in program
    else:
        assert f"eagerly, a float32 max over the {n} index values" in said
        assert ("padded to 4096" in said) == padded
        assert ("blocks first" in said) == (n > 32768)
        assert "reduce_max" in program
    for call in (lambda: f(data, idx), lambda: xgather.onnx.gather_nd(data, jnp.asarray(idx))):
        with pytest.raises(OutOfBoundsError, match=want):
            call()
    idx[p, 0] = -1  # in range: wraps to row 5
    np.testing.assert_array_equal(f(data, idx), data[np.where(idx[:, 0] < 0, 5, idx[:, 0])])


DI = np.arange(12, dtype=np.int32).reshape(3, 4)
LV, BN, OV = xgather.labview.gather, xgather.bnns, xgather.openvino

# Values and attributes that would otherwise be cast, wrapped or guessed at.
BAD_VALUES = [
    ("list-int-beyond-int64", lambda: G(DI, [2**64 - 1]), XGatherError,
     r"^onnx\.Gather-13: Python int indices are int64 and must fit it; "
     r"got index value 18446744073709551615"),
    ("list-mixed-beyond-int64", lambda: G(DI, [2**63, -1]), XGatherError,
     r"must fit it; got index value 9223372036854775808"),
    ("ragged-data", lambda: G([[1, 2], [3]], [0]), XGatherError,
     r"^onnx\.Gather-13: data must be a rectangular nested list"),
    ("ragged-indices", lambda: G(DI, [[0, 1], [0]]), XGatherError,
     r"^onnx\.Gather-13: indices must be a rectangular nested list"),
    ("fill-fraction-int", lambda: G(DI, [9], mode="fill", fill_value=1.7), XGatherError,
     r"^onnx\.Gather-13: fill_value must be a value int32 holds exactly; got 1\.7"),
    ("fill-nan-int", lambda: G(DI, [9], mode="fill", fill_value=float("nan")), XGatherError,
     r"int32 holds exactly; got nan"),
    ("fill-overflow-int", lambda: G(DI, [9], mode="fill", fill_value=2**40), XGatherError,
     r"int32 holds exactly; got 1099511627776"),
    ("fill-negative-uint8", lambda: G(DI.astype(np.uint8), [9], mode="fill", fill_value=-1),
     XGatherError, r"uint8 holds exactly; got -1"),
    ("fill-300-bool", lambda: G(DI > 3, [9], mode="fill", fill_value=300), XGatherError,
     r"bool holds exactly; got 300"),
    ("fill-overflow-float32", lambda: G(D, [9], mode="fill", fill_value=1e40), XGatherError,
     r"fill_value must lie within float32's range \(a finite value stays finite\); got 1e\+40"),
    ("fill-complex-real", lambda: G(D, [9], mode="fill", fill_value=1j), XGatherError,
     r"fill_value for real float32 data must be real; got 1j"),
    ("fill-string-float", lambda: G(D, [9], mode="fill", fill_value="x"), XGatherTypeError,
     r"fill_value for float32 data must be a number; got 'x'"),
    ("fill-array", lambda: G(D, [9], mode="fill", fill_value=np.array([1.0, 2.0])),
     XGatherTypeError, r"fill_value must be a scalar; got an array of shape \(2,\)"),
    ("fill-host-int64", lambda: G(DI.astype(np.int64), [9], mode="fill", fill_value=1.5),
     XGatherError, r"int64 holds exactly; got 1\.5"),
    ("fill-number-string-data", lambda: G(np.array(["a", "b"]), [9], mode="fill", fill_value=5),
     XGatherTypeError, r"fill_value for <U1 data must be a str; got 5"),
    ("fill-openvino-default", lambda: OV.gather(DI, [9], 0, fill_value=0.5), XGatherError,
     r"^openvino\.Gather-8: fill_value must be a value int32 holds exactly; got 0\.5"),
    ("fill-traced", lambda: jax.jit(lambda f: G(D, [9], mode="fill", fill_value=f))(1.0),
     XGatherTypeError, r"fill_value must be a concrete scalar"),
    ("sorted-not-bool", lambda: G(D, [0, 1], indices_are_sorted="no"), XGatherError,
     r"^onnx\.Gather-13: indices_are_sorted must be a bool; got 'no'"),
    ("unique-not-bool", lambda: ND(D, [[0]], unique_indices=None), XGatherError,
     r"^onnx\.GatherND-13: unique_indices must be a bool; got None"),
    ("batch-dims-bool", lambda: BN.gather(D, np.zeros((2, 1), np.int32), 1, True), XGatherError,
     r"^bnns\.Gather: batch_dimension_count must be an int; got True"),
    ("batch-dims-float", lambda: BN.gather_nd(D, np.zeros((2, 1), np.int32), 1.0), XGatherError,
     r"^bnns\.GatherND: batch_dimension_count must be an int; got 1\.0"),
    ("batch-dims-array", lambda: ND(D, np.zeros((2, 1), np.int64), np.array([1])), XGatherError,
     r"^onnx\.GatherND-13: batch_dims must be an int; got array\(\[1\]\)"),
    ("openvino-batch-dims-str", lambda: OV.gather_nd(D, np.zeros((2, 1), np.int64), "1"),
     XGatherError, r"^openvino\.GatherND-8: batch_dims must be an int; got '1'"),
    ("openvino-version-float", lambda: OV.gather(DI, [0], 0, version=8.0), XGatherError,
     r"^openvino\.Gather: version must be one of 1, 7, 8; got version=8\.0"),
    ("openvino-1-batch-dims-str", lambda: OV.gather(DI, [0], 0, "x", version=1), XGatherError,
     r"^openvino\.Gather-1: batch_dims must be an int; got 'x'"),
    ("checked-not-callable", lambda: xgather.checked(5), XGatherTypeError,
     r"^xgather\.checked: fn must be a callable \(a function of arrays\); got int"),
    ("host-path-under-jit", lambda: jax.jit(lambda i: G(np.array(["a", "b"]), i))(np.array([0])),
     XGatherTypeError, r"^onnx\.Gather-13: string data, and 64-bit data while jax_enable_x64 is "
                       r"off, take the host path, which cannot run under a JAX transformation"),
    ("labview-training-str", lambda: LV(D, [0], training="False"), XGatherError,
     r"^labview\.Gather: training must be a bool \(known when tracing\); got 'False'"),
    ("labview-lda-str", lambda: LV(D, [0], lda_coeff="2"), XGatherError,
     r"^labview\.Gather: lda_coeff must be a real number \(known when tracing\); got '2'"),
    ("labview-lda-bool", lambda: LV(D, [0], lda_coeff=True), XGatherError,
     r"lda_coeff must be a real number"),
    ("labview-lda-traced",
     lambda: jax.grad(lambda c: LV(D, [0], lda_coeff=c).sum())(1.0), XGatherError,
     r"lda_coeff must be a real number \(known when tracing\); got .*Tracer"),
    ("labview-name-int", lambda: LV(D, [0], name=123), XGatherError,
     r"^labview\.Gather: name must be a str; got 123"),
    ("labview-outputs-dict", lambda: LV(D, [0], specified_outputs_name={"a": 1}), XGatherError,
     r"specified_outputs_name must be a str or a list of str; got \{'a': 1\}"),
]


@pytest.mark.parametrize("call, exc, pattern", [pytest.param(*b[1:], id=b[0])
                                                for b in BAD_VALUES])
def test_bad_values_and_attributes_are_errors(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()


def test_fill_values_the_dtype_holds():
    """Exact values fill integer data; floating data takes the nearest value; text is
    never cut to the data's width."""
    from tests import reference as ref
    idx = np.array([1, 9])
    for data, fill in [(DI, 1.0), (DI, np.int64(-7)), (DI.astype(np.uint8), 255),
                       (DI > 3, 1), (D[0], 0.1), (D[0], float("-inf")), (D[0], float("nan")),
                       (D[0].astype(np.complex64), 1 + 2j)]:
        want = ref.gather(data, idx, oob="fill", fill=np.asarray(fill).astype(data.dtype)[()])
        got = np.asarray(G(data, idx, mode="fill", fill_value=fill))
        np.testing.assert_array_equal(got, want)
        assert got.dtype == data.dtype
    words = np.array(["a", "b"])
    out = G(words, [1, 5], mode="fill", fill_value="xyz")
    assert out.tolist() == ["b", "xyz"]
