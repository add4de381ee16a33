"""Every ONNX data type, bit for bit, through every op; x64 off here and on in a subprocess."""

from __future__ import annotations

import functools
import re

import jax
import ml_dtypes
import numpy as np
import pytest
from jax.experimental import checkify

import xgather
from tests import reference as ref
from tests.helpers import rerun_with_x64, spec_path

X64 = bool(jax.config.jax_enable_x64)
WIDE = {"int64", "uint64", "float64", "complex128"}


def special_values(dtype, n: int) -> np.ndarray:
    """``n`` values of ``dtype`` with the corner cases its kind has."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(0)
    if dtype.kind == "b":
        return rng.integers(0, 2, n).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        base = [info.min, info.max, 0, 1]
        if dtype.itemsize == 8:
            base += [2**53 + 1, (2**63 - 25) if dtype.kind == "i" else 2**64 - 3]
        vals = np.array(base + list(rng.integers(info.min // 2, info.max // 2, n)), dtype)
        return vals[:n]
    if dtype.kind in "USO":
        words = ["", "a", "ünïcödé", "数据", "🙂 emoji", "x" * 37, "gather", "\u00e9\u0301"]
        return np.array([words[i % len(words)] + str(i) * (i % 3) for i in range(n)],
                        dtype=object if dtype.kind == "O" else str)
    if dtype.kind == "c":
        re_ = special_values(np.float64 if dtype.itemsize == 16 else np.float32, n)
        im = special_values(np.float64 if dtype.itemsize == 16 else np.float32, n)[::-1]
        out = np.empty(n, dtype)
        out.real, out.imag = re_, im
        return out
    # floats (numpy and ml_dtypes): NaN with payloads, signed zeros, infinities, subnormals
    uint = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[dtype.itemsize]
    finfo = ml_dtypes.finfo(dtype)
    vals = [np.nan, -0.0, 0.0, np.inf, -np.inf, float(finfo.smallest_subnormal),
            -float(finfo.smallest_subnormal), float(finfo.max), 1.5]
    out = np.array(vals + list(rng.standard_normal(n)), np.float64).astype(dtype)[:n]
    bits = out.view(uint)
    # a NaN with a payload: exponent all ones, a mantissa bit other than the quiet bit
    nbits = dtype.itemsize * 8
    mant = {16: 10 if dtype == np.float16 else 7, 32: 23, 64: 52}[nbits]
    exp_ones = ((1 << (nbits - 1 - mant)) - 1) << mant
    bits[min(9, n - 1)] = uint(exp_ones | 0b101)
    bits[min(10, n - 1)] = uint((1 << (nbits - 1)) | exp_ones | (1 << (mant - 1)) | 3)
    return bits.view(dtype)


DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", ml_dtypes.bfloat16, "float32", "float64", "complex64", "complex128", "str",
          "object"]


def same_bits(got, want):
    got = got if isinstance(got, np.ndarray) else np.asarray(got)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape)
    if want.dtype.kind in "USOb":
        assert got.tolist() == want.tolist()
        return
    uint = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64, 16: np.uint64}[
        want.dtype.itemsize]
    np.testing.assert_array_equal(np.ascontiguousarray(got).view(uint),
                                  np.ascontiguousarray(want).view(uint))


I3 = np.array([[2, -1, 0], [1, 1, -3]])          # Gather / GatherElements, axis size 3
ND = np.array([[[1, -1]], [[0, 2]]])              # GatherND tuples into (3, 4)
POS = np.array([[2, 0, 1], [1, 1, 0]])            # BNNS: non-negative only
E3 = np.array([[2, -1, 0], [1, 1, -3], [0, 2, 1]])  # OpenVINO GatherElements on (3, 3)

OPS = {
    "onnx.gather": (lambda d: xgather.onnx.gather(d, I3, 0), lambda d: ref.gather(d, I3, 0)),
    "onnx.gather_nd": (lambda d: xgather.onnx.gather_nd(d, ND), lambda d: ref.gather_nd(d, ND)),
    "onnx.gather_elements": (lambda d: xgather.onnx.gather_elements(d, I3[:, :2], 1),
                             lambda d: ref.gather_elements(d, I3[:, :2], 1)),
    "openvino.gather8": (lambda d: xgather.openvino.gather(d, np.array([[0, 5, -4]]), 1),
                         lambda d: ref.gather(d, np.array([[0, 5, -4]]), 1, oob="fill",
                                              fill=np.zeros((), d.dtype)[()])),
    "openvino.gather_nd": (lambda d: xgather.openvino.gather_nd(d, ND, version=5),
                           lambda d: ref.gather_nd(d, ND)),
    "openvino.gather_elements": (lambda d: xgather.openvino.gather_elements(d, E3, 0),
                                 lambda d: ref.gather_elements(d, E3, 0)),
    "bnns.gather_nd": (lambda d: xgather.bnns.gather_nd(d, np.abs(ND).astype(np.int32)),
                       lambda d: ref.gather_nd(d, np.abs(ND), negative=False)),
    "bnns.gather": (lambda d: xgather.bnns.gather(d, POS, 0),
                    lambda d: ref.gather(d, POS, 0, negative=False)),
    "bnns.gather_along_axis": (lambda d: xgather.bnns.gather_along_axis(d, POS[:, [0, 1, 2, 0]], 0),
                               lambda d: ref.gather_elements(d, POS[:, [0, 1, 2, 0]], 0,
                                                             negative=False)),
    "labview.gather": (lambda d: xgather.labview.gather(d, I3, 0), lambda d: ref.gather(d, I3, 0)),
}


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name if d != "object"
                         else "object")
def test_table(dtype, op):
    dtype = np.dtype(dtype)
    data = special_values(dtype, 12).reshape(3, 4)
    got_fn, want_fn = OPS[op]
    if op == "openvino.gather_elements":
        data = special_values(dtype, 9).reshape(3, 3)
    want = want_fn(data)
    if op == "openvino.gather8" and dtype.kind in "USO":
        want = ref.gather(data, np.array([[0, 5, -4]]), 1, oob="fill", fill="")
    got = got_fn(data)
    same_bits(got, want)
    host = dtype.kind in "USO" or (dtype.name in WIDE and not X64)
    assert isinstance(got, np.ndarray) == host, type(got)


def test_host_path_data_inside_jit_is_a_clear_error():
    for data in (np.array(["a", "b"]), np.arange(4.0)):
        if data.dtype == np.float64 and X64:
            continue  # JAX holds float64 then: no host path
        f = jax.jit(lambda data=data: xgather.onnx.gather(data, np.array([1])))
        with pytest.raises(xgather.XGatherTypeError, match=r"^onnx\.Gather-13: string data, and "
                           r"64-bit data .* cannot run inside jax\.jit"):
            f()


def test_lists_of_numpy_integer_scalars_are_indices():
    data = np.arange(4.0, dtype=np.float32)
    for idx in ([np.uint32(1), np.uint8(3)], [np.int16(-1)], [np.uint64(2)]):
        np.testing.assert_array_equal(xgather.openvino.gather(data, idx, 0),
                                      data[[int(i) for i in idx]])
    with pytest.raises(xgather.XGatherError, match=r"int64 and must fit it; got index value "
                                                   r"9223372036854775808"):
        xgather.openvino.gather(data, [np.uint64(2**63)], 0)


def test_bytes_keep_their_dtype_where_filled():
    data = np.array([b"ab", b"cd", b"e"])
    for out in (xgather.openvino.gather(data, [5, 1], 0),
                xgather.onnx.gather(data, [5, 1], mode="fill")):
        assert out.dtype == data.dtype and out.tolist() == [b"", b"cd"]


def test_strings_follow_the_same_semantics():
    words = np.array(["α", "bb", "ççç", "dddd"], dtype=object)
    assert xgather.onnx.gather(words, [-1, 0]).tolist() == ["dddd", "α"]
    assert xgather.onnx.gather(words, [9], mode="fill", fill_value="∅").tolist() == ["∅"]
    with pytest.raises(xgather.OutOfBoundsError, match=r"index 9 at indices\[1\]"):
        xgather.onnx.gather(words, [0, 9])
    grid = np.array([["a", "b"], ["c", "d"]])
    assert xgather.onnx.gather_nd(grid, [[[1]], [[0]]], batch_dims=1).tolist() == [["b"], ["c"]]
    with pytest.raises(TypeError, match="host path, which cannot run under a JAX transformation"):
        jax.jit(lambda i: xgather.onnx.gather(words, i))(np.array([0]))


def test_host_path_results_of_no_axes_are_arrays_of_the_datas_dtype():
    # one index picks one element: a 0-d array, as the device path gives, not a NumPy scalar
    cases = [(np.array(["abcd", "x"]), "x")]
    if not X64:  # else on the device
        cases.append((np.array([1, 2**62 + 1], np.uint64), 2**62 + 1))
    for data, want in cases:
        for out in (xgather.openvino.gather(data, np.int64(1), 0),
                    xgather.onnx.gather(data, np.array(1)),
                    xgather.onnx.gather_nd(data, np.array([1]))):
            assert type(out) is np.ndarray and out.shape == () and out.dtype == data.dtype
            assert out.item() == want


def test_list_data_beyond_the_default_integer_is_a_clear_error():
    big, kind = (2**64 - 1, np.uint64) if X64 else (2**40, np.int64)
    with pytest.raises(xgather.XGatherTypeError,
                       match=r"^openvino\.Gather-8: data as a list holds an integer that JAX's "
                             rf"default integer type cannot hold .* pass it as a NumPy "
                             rf"{np.dtype(kind).name} array"):
        xgather.openvino.gather([big, 1], [0], 0)
    out = np.asarray(xgather.openvino.gather(np.array([big, 1], kind), [0], 0))  # exact
    assert out.dtype == kind and out.tolist() == [big]


@pytest.mark.skipif(X64, reason="checks the x64-off behaviour")
def test_wide_values_without_x64_stay_exact():
    big = np.array([2**53 + 1, 2**62 + 3, -(2**63)], np.int64)
    out = xgather.onnx.gather(big, [2, 0, -2])
    assert out.dtype == np.int64 and out.tolist() == [-(2**63), 2**53 + 1, 2**62 + 3]
    u = np.array([2**64 - 1, 2**63], np.uint64)
    assert xgather.onnx.gather_elements(u, [1, -2]).tolist() == [2**63, 2**64 - 1]
    # An index beyond int32 is out of range, reported as given (not cut to 32 bits).
    with pytest.raises(xgather.OutOfBoundsError, match=r"index 4294967296 at indices\[0\] is "
                                                       r"out of range \[-3, 2\]"):
        xgather.onnx.gather(np.zeros(3, np.float32), np.array([2**32], np.int64))


def test_index_types_per_spec():
    data = np.arange(5, dtype=np.float32)
    for itype in ("int8", "int16", "uint8", "uint16", "uint32", "uint64"):
        with pytest.raises(xgather.XGatherTypeError, match=rf"onnx\.Gather-13: indices must be "
                                                           rf"int32 or int64; got {itype}"):
            xgather.onnx.gather(data, np.array([1], itype))
        same_bits(xgather.openvino.gather(data, np.array([1, 4], itype), 0), data[[1, 4]])


def test_no_silent_promotion():
    for dtype in (np.bool_, np.float16, ml_dtypes.bfloat16, np.int8):
        data = np.zeros(4, dtype)
        assert np.asarray(xgather.onnx.gather(data, [1])).dtype == np.dtype(dtype)
    assert xgather.onnx.gather([1, 2, 3], [0]).dtype == (np.int64 if X64 else np.int32)
    assert xgather.onnx.gather([1.5, 2.0], [0]).dtype == (np.float64 if X64 else np.float32)


@pytest.mark.parametrize("mode", ["clip", "fill", "error"])
def test_indices_at_the_ends_of_their_type(mode):
    """The negative wrap at the widest index type in use (int64 in the x64 run)."""
    itype = np.int64 if X64 else np.int32
    lo, hi = np.iinfo(itype).min, np.iinfo(itype).max
    data = np.arange(10, dtype=np.float32)
    idx = np.array([lo, lo + 1, -11, -10, -1, 0, 9, 10, hi - 1, hi], itype)
    if mode == "error":
        ok = idx[(idx >= -10) & (idx < 10)]
        np.testing.assert_array_equal(
            xgather.checked(jax.jit(lambda d, i: xgather.onnx.gather(d, i)))(data, ok),
            ref.gather(data, ok))
        with pytest.raises(xgather.OutOfBoundsError, match=rf"index {lo} at indices\[0\]"):
            xgather.checked(sync=True)(jax.jit(lambda d, i: xgather.onnx.gather(d, i)))(data, idx)
        return
    got = xgather.checked(jax.jit(lambda d, i: xgather.onnx.gather(d, i, mode=mode,
                                                                    fill_value=-1.0)))(data, idx)
    np.testing.assert_array_equal(got, ref.gather(data, idx, oob=mode, fill=-1.0))


BEYOND_INT32 = np.array([2**32 + 5, 2**40, -2**32 + 3, np.iinfo(np.int64).min,
                 np.iinfo(np.int64).max, 2**31, -2**31 - 1, 3, -2], np.int64)


@pytest.mark.parametrize("mode", ["clip", "fill"])
@pytest.mark.parametrize("op", ["gather", "gather_nd", "gather_elements"])
def test_int64_indices_beyond_int32_stay_out_of_range(op, mode):
    """XLA:CPU keeps the low 32 bits of such an index (2**32 + 5 reads row 5); xgather not."""
    data = np.arange(10, dtype=np.float32)
    call = {"gather": (xgather.onnx.gather, BEYOND_INT32, ref.gather),
            "gather_nd": (xgather.onnx.gather_nd, BEYOND_INT32[:, None], ref.gather_nd),
            "gather_elements": (xgather.onnx.gather_elements, BEYOND_INT32, ref.gather_elements)}
    fn, idx, want = call[op]
    expected = want(data, idx, oob=mode, fill=-1.0)
    if X64:
        f = jax.jit(lambda d, i: fn(d, i, mode=mode, fill_value=-1.0))
        np.testing.assert_array_equal(f(data, idx), expected)
    # Where xgather sees the NumPy indices (eager calls, constants under jit; with x64 off
    # they are saturated into int32, out of range on the same side). An int64 array passed
    # as a jit argument with x64 off is cut to int32 by JAX itself, before any op sees it.
    for _ in range(2):  # the second call takes the cached path
        np.testing.assert_array_equal(fn(data, idx, mode=mode, fill_value=-1.0), expected)
    const = jax.jit(lambda d: fn(d, idx, mode=mode, fill_value=-1.0))
    np.testing.assert_array_equal(const(data), expected)
    if op == "gather":  # and the gradient goes where the forward read
        ct = np.arange(1, idx.size + 1, dtype=np.float32)
        g = jax.grad(lambda d: (fn(d, idx, mode=mode) * ct).sum())(data)
        np.testing.assert_array_equal(g, ref.scatter_add_take(data.shape, idx, ct, oob=mode))


@pytest.mark.parametrize("how", ["positional", "keyword", "scalar", "unsigned", "in a dict",
                                 "in a tuple", "memmap"])
def test_checked_arguments_beyond_int32(how, tmp_path):
    """With x64 off, jax.jit cuts a 64-bit NumPy argument to 32 bits (2**32 + 1 would read
    row 1, without a word): a checked function refuses it at the call, naming the value
    and what it would become. With x64 on it is the out-of-range index it is."""
    data = np.arange(10, dtype=np.float32)
    value, bad, cut = {"positional": (np.array([3, 2**32 + 1]), 2**32 + 1, 1),
                       "keyword": (np.array([[3], [-2**40]]), -2**40, 0),
                       "scalar": (np.int64(2**33 + 7), 2**33 + 7, 7),
                       "unsigned": (np.array([2**32 + 1], np.uint64), 2**32 + 1, 1),
                       "in a dict": (np.array([2**31]), 2**31, -2**31),
                       "in a tuple": (np.array([5, 2**32 + 9]), 2**32 + 9, 9),
                       "memmap": (np.array([2**32 + 1, 0]), 2**32 + 1, 1)}[how]
    if how == "memmap":  # a subclass of ndarray: ids read from a file
        mapped = np.memmap(tmp_path / "ids", dtype=np.int64, mode="w+", shape=value.shape)
        mapped[:] = value
        value = mapped
    if how == "unsigned":  # OpenVINO takes any integer type; its out-of-range rows are zeros
        f = xgather.checked(lambda d, i: xgather.openvino.gather(d, i, 0))
    elif how == "in a dict":  # a batch of ids, as a data loader gives it
        f = xgather.checked(lambda d, batch: xgather.onnx.gather(d, batch["ids"]))
    elif how == "in a tuple":
        f = xgather.checked(lambda d, pair: xgather.onnx.gather(d, pair[1]))
    else:
        f = xgather.checked(lambda d, i: xgather.onnx.gather(d, i))
    wrap = {"in a dict": lambda i: {"ids": i, "mask": np.ones(3, bool)},
            "in a tuple": lambda i: (np.zeros(2, np.float32), i)}.get(how, lambda i: i)
    call = (lambda: f(data, i=value)) if how == "keyword" else (lambda: f(data, wrap(value)))
    if X64:
        if how == "unsigned":
            np.testing.assert_array_equal(call(), ref.gather(data, value, oob="fill", fill=0))
        else:
            call()
            with pytest.raises(xgather.OutOfBoundsError, match=rf"index {bad} at indices"):
                xgather.raise_if_error()
    else:
        name = {"keyword": "'i'", "in a dict": r"1\['ids'\]", "in a tuple": r"1\[1\]"}.get(
            how, "1")
        with pytest.raises(xgather.XGatherTypeError,
                           match=rf"argument {name}, a NumPy u?int64( array)?, is cut to 32 "
                                 rf"bits .* its value {bad}( at \[.*\])? would become {cut}\."):
            call()
    # 64-bit NumPy indices that fit are taken as they are
    fit = np.array([3, -1]) if how != "unsigned" else np.array([3, 9], np.uint64)
    if how == "memmap":
        value[:] = [3, -1]
        fit = value
    np.testing.assert_array_equal(f(data, wrap(fit)), ref.gather(data, fit))
    xgather.raise_if_error()


@pytest.mark.parametrize("value", [*BEYOND_INT32[:7], np.uint64(2**32 + 2), np.uint64(2**64 - 1)],
                         ids=repr)
def test_numpy_scalar_indices_beyond_int32(value):
    # A NumPy scalar is narrowed as an array is (JAX would cut it to 32 bits): every mode
    # treats it as the out-of-range index it is, on the side it is.
    data = np.arange(10, dtype=np.float32)
    # ONNX takes int32/int64 indices; OpenVINO any integer type
    op = xgather.onnx.gather if value.dtype.kind == "i" else functools.partial(
        xgather.openvino.gather, axis=0)
    for mode in ("clip", "fill"):
        want = ref.gather(data, np.asarray([value]).astype(object), oob=mode, fill=-1.0)[0]
        assert op(data, value, mode=mode, fill_value=-1.0) == want
    assert xgather.openvino.gather(data, value, 0) == 0
    with pytest.raises(xgather.OutOfBoundsError, match=rf"index {int(value)} at indices "
                                                       r"\(a scalar\) is out of range"):
        op(data, value, mode="error")


@pytest.mark.parametrize("mode", ["clip", "fill"])
def test_unsigned_constant_indices_with_the_top_bit_set(mode):
    """openxla/xla#48717 folds such a constant index to 0 in an unclamped gather."""
    data = np.arange(10, dtype=np.float32)
    idx = np.array([2**31 + 5, 2**32 - 1, 7], np.uint32)
    f = jax.jit(lambda d: xgather.openvino.gather(d, idx, 0, mode=mode, fill_value=-1.0))
    np.testing.assert_array_equal(f(data), ref.gather(data, idx, oob=mode, fill=-1.0))


@pytest.mark.subprocess
@pytest.mark.skipif(X64, reason="already the x64 run")
def test_table_with_x64_on():
    rerun_with_x64(__file__, "not x64_on")




@pytest.mark.skipif(not X64, reason="an axis of 2**31 elements needs x64 (the x64 rerun)")
@pytest.mark.parametrize("kind", ["traced", "numpy"])
def test_int32_indices_into_an_axis_of_2_31_elements(kind):
    # Every int32 value addresses such an axis (-1 is its last element): the plan widens
    # them where i + s would not fit. Traced with eval_shape: no 2 GiB array is made.
    n = 2**31 + 8
    data = jax.ShapeDtypeStruct((n,), np.int8)
    idx = np.array([5, -1, np.iinfo(np.int32).max, np.iinfo(np.int32).min], np.int32)
    for op, kw in [(xgather.onnx.gather, {}), (xgather.onnx.gather, {"mode": "fill"}),
                   (xgather.onnx.gather, {"mode": "clip"}), (xgather.openvino.gather, {"axis": 0}),
                   (xgather.onnx.gather_nd, {}), (xgather.onnx.gather_elements, {})]:
        i = idx[:, None] if op is xgather.onnx.gather_nd else idx
        if kind == "traced":
            fn = checkify.checkify(lambda d, j, op=op, kw=kw: op(d, j, **kw))
            out = jax.eval_shape(fn, data, jax.ShapeDtypeStruct(i.shape, i.dtype))
        else:
            out = jax.eval_shape(lambda d, op=op, kw=kw, i=i: op(d, i, **kw), data)
        out = out[1] if kind == "traced" else out
        assert out.shape == (4,) and out.dtype == np.int8


def test_openvino_zeros_for_indices_beyond_int32():
    """Gather-8: an index outside [-s, s-1] gives zeros, however wide (x64 on or off)."""
    data = np.arange(1.0, 4.0, dtype=np.float32)
    idx = np.array([1, 2**31, -2**31 - 1, 2**40, -1, np.iinfo(np.int64).min], np.int64)
    want = ref.gather(data, idx, oob="fill", fill=0.0)
    assert want.tolist() == [2.0, 0.0, 0.0, 0.0, 3.0, 0.0]
    for _ in range(2):
        np.testing.assert_array_equal(xgather.openvino.gather(data, idx, 0), want)
    u = np.array([2, 2**32 + 1, 2**64 - 1], np.uint64)
    np.testing.assert_array_equal(xgather.openvino.gather(data, u, 0),
                                  ref.gather(data, u, oob="fill", fill=0.0))


@pytest.mark.parametrize("idx, where, count", [
    (np.array([1, 2**31, -2**31 - 1], np.int64), "indices\\[1\\]", 2),
    (np.array([-2**40, 0], np.int64), "indices\\[0\\]", 1),
])
def test_indices_beyond_int32_are_reported_as_given(idx, where, count):
    data = np.arange(3, dtype=np.float32)
    bad = idx[(idx < -3) | (idx > 2)][0]
    msg = (rf"^onnx\.Gather-13: index {bad} at {where} is out of range \[-3, 2\] for data axis 0 "
           rf"of size 3 \({count} out-of-range value\(s\) in indices\)")
    for _ in range(2):  # first call, then the cached path
        with pytest.raises(xgather.OutOfBoundsError, match=msg):
            xgather.onnx.gather(data, idx)
    with pytest.raises(xgather.OutOfBoundsError, match=msg):
        xgather.checked(sync=True)(jax.jit(lambda d: xgather.onnx.gather(d, idx)))(data)


# Candidate data types: every type of the table above, and JAX's narrow float and int types.
CANDIDATES = [d for d in DTYPES if d != "object"] + [
    ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.int4, ml_dtypes.uint4]
_ONNX_NAME = {"float32": "float", "float64": "double", "str": "string"}


def _sample(dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype.kind == "U":
        return np.array([["a", "b", "c"]] * 3)
    return np.zeros((3, 3), dtype)


def _accepts(fn, data, *args, **kw) -> bool:
    try:
        fn(data, *args, **kw)
    except xgather.XGatherTypeError as e:
        assert "data must be of a type the spec allows" in str(e), e
        assert f"got {'string' if data.dtype.kind == 'U' else data.dtype.name}" in str(e), e
        return False
    return True


@pytest.mark.parametrize("op_type, version", [
    ("Gather", 1), ("Gather", 11), ("Gather", 13), ("GatherND", 11), ("GatherND", 12),
    ("GatherND", 13), ("GatherElements", 11), ("GatherElements", 13)])
def test_onnx_data_types_per_version(op_type, version):
    """T of each op version, as onnx's own schema table gives it (bfloat16 from 13)."""
    defs = pytest.importorskip("onnx.defs")
    [t] = [c for c in defs.get_schema(op_type, version).type_constraints
           if c.type_param_str == "T"]
    fn, idx = {"Gather": (xgather.onnx.gather, np.array([2, -1])),
               "GatherND": (xgather.onnx.gather_nd, np.array([[2, -1]])),
               "GatherElements": (xgather.onnx.gather_elements, np.array([[2, -1, 0]] * 3))
               }[op_type]
    for dtype in CANDIDATES:
        name = np.dtype(dtype).name if np.dtype(dtype).kind != "U" else "str"
        spec = f"tensor({_ONNX_NAME.get(name, name)})" in t.allowed_type_strs
        assert _accepts(fn, _sample(dtype), idx, opset=version) == spec, (op_type, version, name)
    if version < 13:  # the error says where bfloat16 comes in
        with pytest.raises(xgather.XGatherTypeError, match="bfloat16 comes with version 13"):
            fn(_sample(ml_dtypes.bfloat16), idx, opset=version)


def test_labview_data_types_as_the_block_lists_them():
    text = spec_path("labview-deep-learning-gather.txt").read_text()
    listed = set(re.findall(r"tensor\((\w+)\)", re.search(r"T in \((.*?)\) :", text, re.S)[1]))
    assert {"bfloat16", "string", "complex128"} <= listed and "float8e4m3fn" not in listed
    for dtype in CANDIDATES:
        name = np.dtype(dtype).name if np.dtype(dtype).kind != "U" else "str"
        assert _accepts(xgather.labview.gather, _sample(dtype), np.array([2, -1])) == \
            (_ONNX_NAME.get(name, name) in listed), name


def test_negative_zero_fill_keeps_its_sign_whatever_ran_before():
    # -0.0 == 0.0 in Python: as cache keys they were one entry, so the sign came from
    # whichever call ran first (eager calls and jitted ones alike).
    data = np.arange(3, dtype=np.float32)
    idx = np.array([5, 1])
    for first, second in [(0.0, -0.0), (-0.0, 0.0), (0.0, np.float32(-0.0)),
                          (0.0, complex(-0.0, 1.0))]:
        xgather._frontend.clear_caches()
        for fill in (first, second):
            d = data.astype(np.complex64) if isinstance(fill, complex) else data
            want = np.where(idx < 3, d[np.minimum(idx, 2)], np.asarray(fill, d.dtype))
            calls = (lambda d, f: xgather.onnx.gather(d, idx, mode="fill", fill_value=f),
                     lambda d, f: jax.jit(lambda x: xgather.onnx.gather(
                         x, idx, mode="fill", fill_value=f))(d),
                     lambda d, f: xgather.openvino.gather(d, idx, 0, fill_value=f, mode="fill"))
            for call in calls:
                got = np.asarray(call(d, fill))
                assert got.tobytes() == want.tobytes(), (first, second, got, want)


def test_empty_axis_keeps_the_weak_type():
    from jax._src.lax.lax import _convert_element_type
    for cols in (0, 2):  # the empty axis fills; the other gathers: both stay weakly typed
        weak = _convert_element_type(jax.numpy.zeros((3, cols)), np.dtype(np.float32),
                                     weak_type=True)
        out = xgather.onnx.gather(weak, np.array([0]), axis=1, mode="fill")
        assert out.aval.weak_type and out.shape == (3, 1)
