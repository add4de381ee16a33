"""ONNX Gather / GatherND / GatherElements against the NumPy reference (tests/reference.py)."""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest

import xgather
from tests import reference as ref
from tests.helpers import assert_same, check_everywhere

RNG = np.random.default_rng(1234)
SHAPES = [(5,), (3, 4), (2, 3, 4), (2, 1, 3, 2), (2, 2, 1, 2, 3), (1, 2, 2, 1, 2, 2)]


def _indices(shape, s, negative=True):
    lo = -s if negative else 0
    return RNG.integers(lo, s, size=shape).astype(np.int64) if s else np.zeros(shape, np.int64)


def _data(shape, dtype=np.float32):
    return (RNG.standard_normal(shape) * 10).astype(dtype)


# An older opset changes the op's name and its static rules (tests/test_errors.py), not what
# an index reads: the older opsets take the small ranks (GatherND-12, which brought
# batch_dims, up to rank 3).
def gather_cases():
    for opset, shape in itertools.product((1, 11, 13), SHAPES):
        if opset != 13 and len(shape) > 2:
            continue
        r = len(shape)
        for axis in sorted({0, r - 1, -1, -r}):
            s = shape[axis]
            for ishape in [(), (0,), (3,), (2, 2)][: 4 if opset == 13 else 2 + (r % 3)]:
                yield pytest.param(opset, _data(shape), _indices(ishape, s), axis,
                                   id=f"opset{opset}-r{r}-axis{axis}-idx{ishape}")
    # zero-size dimensions: off the axis, and on the axis with empty indices
    yield pytest.param(13, _data((0, 3)), _indices((2,), 3), 1, id="zero-size-off-axis")
    yield pytest.param(13, _data((3, 0)), _indices((0, 2), 3), 0, id="zero-size-slices")
    yield pytest.param(13, _data((3, 0)), _indices((0,), 0), 1, id="empty-axis-empty-indices")
    yield pytest.param(13, _data((4, 2)), np.array([-4, -1, 0, 3, -2], np.int32), 0, id="int32-neg")


@pytest.mark.parametrize("opset, data, indices, axis", list(gather_cases()))
def test_gather(opset, data, indices, axis):
    check_everywhere(lambda d, i: xgather.onnx.gather(d, i, axis, opset=opset),
                     data, indices, lambda d, i: ref.gather(d, i, axis))


def gather_nd_cases():
    for opset, shape in itertools.product((11, 12, 13), SHAPES):
        if opset != 13 and len(shape) > (3 if opset == 12 else 2):
            continue
        r = len(shape)
        for b in range(0, r if opset >= 12 else 1):
            for k in sorted({1, r - b}):
                for lead in [(), (3,), (2, 2)][: 3 if opset == 13 else 2]:
                    ishape = shape[:b] + lead
                    cols = [_indices(ishape + (1,), shape[b + j]) for j in range(k)]
                    idx = np.concatenate(cols, axis=-1)
                    yield pytest.param(opset, _data(shape), idx, b,
                                       id=f"opset{opset}-r{r}-b{b}-k{k}-lead{lead}")
    yield pytest.param(13, _data((2, 3, 0)), _indices((4, 2), 2) % 2, 0, id="zero-size-slice")
    yield pytest.param(13, _data((2, 3)), np.zeros((0, 2), np.int64), 0, id="no-tuples")
    yield pytest.param(13, _data((2, 3, 4)), np.zeros((2, 0, 1), np.int64), 1, id="batch-no-tuples")


@pytest.mark.parametrize("opset, data, indices, batch_dims", list(gather_nd_cases()))
def test_gather_nd(opset, data, indices, batch_dims):
    check_everywhere(lambda d, i: xgather.onnx.gather_nd(d, i, batch_dims, opset=opset),
                     data, indices, lambda d, i: ref.gather_nd(d, i, batch_dims), tuples=True)


def gather_elements_cases():
    for opset, shape in itertools.product((11, 13), SHAPES):
        if opset != 13 and len(shape) > 2:
            continue
        r = len(shape)
        for axis in sorted({0, r - 1, -1}):
            s = shape[axis]
            for grow in (0, 2):
                ishape = tuple((n + grow if i == axis % r else n) for i, n in enumerate(shape))
                yield pytest.param(opset, _data(shape), _indices(ishape, s), axis,
                                   id=f"opset{opset}-r{r}-axis{axis}-grow{grow}")
    yield pytest.param(13, _data((3, 4)), _indices((2, 1), 3), 0, id="smaller-off-axis")
    yield pytest.param(13, _data((3, 4)), _indices((3, 0), 4), 1, id="empty")
    yield pytest.param(13, _data((0, 4)), _indices((0, 6), 4), 1, id="zero-size-data")


@pytest.mark.parametrize("opset, data, indices, axis", list(gather_elements_cases()))
def test_gather_elements(opset, data, indices, axis):
    check_everywhere(lambda d, i: xgather.onnx.gather_elements(d, i, axis, opset=opset),
                     data, indices, lambda d, i: ref.gather_elements(d, i, axis))


# The examples of the spec texts (shared/specs), verbatim.
def test_spec_examples():
    data = np.array([[1.0, 1.2], [2.3, 3.4], [4.5, 5.7]], np.float32)
    assert_same(xgather.onnx.gather(data, np.array([[0, 1], [1, 2]])),
                np.array([[[1.0, 1.2], [2.3, 3.4]], [[2.3, 3.4], [4.5, 5.7]]], np.float32))
    data = np.array([[1.0, 1.2, 1.9], [2.3, 3.4, 3.9], [4.5, 5.7, 5.9]], np.float32)
    assert_same(xgather.onnx.gather(data, np.array([[0, 2]]), axis=1),
                np.array([[[1.0, 1.9]], [[2.3, 3.9]], [[4.5, 5.9]]], np.float32))
    d2 = np.array([[0, 1], [2, 3]], np.int32)
    d3 = np.array([[[0, 1], [2, 3]], [[4, 5], [6, 7]]], np.int32)
    nd = xgather.onnx.gather_nd
    assert_same(nd(d2, np.array([[0, 0], [1, 1]])), np.array([0, 3], np.int32))
    assert_same(nd(d2, np.array([[1], [0]])), np.array([[2, 3], [0, 1]], np.int32))
    assert_same(nd(d3, np.array([[0, 1], [1, 0]])), np.array([[2, 3], [4, 5]], np.int32))
    assert_same(nd(d3, np.array([[[0, 1]], [[1, 0]]])), np.array([[[2, 3]], [[4, 5]]], np.int32))
    assert_same(nd(d3, np.array([[1], [0]]), batch_dims=1), np.array([[2, 3], [4, 5]], np.int32))


@pytest.mark.parametrize("mode", ["clip", "fill"])
def test_out_of_range_modes(mode):
    data = _data((4, 3))
    idx = np.array([[-9, -4, -1, 0, 3, 4, 100]])
    fill = -7.5
    kw = dict(mode=mode, fill_value=fill) if mode == "fill" else dict(mode=mode)
    check_everywhere(lambda d, i: xgather.onnx.gather(d, i, 0, **kw), data, idx,
                     lambda d, i: ref.gather(d, i, 0, oob=mode, fill=fill))
    nd_idx = np.array([[0, 5], [-5, 1], [3, -3], [1, 1]])
    check_everywhere(lambda d, i: xgather.onnx.gather_nd(d, i, **kw), data, nd_idx,
                     lambda d, i: ref.gather_nd(d, i, oob=mode, fill=fill), tuples=True)
    el_idx = np.array([[0, 9, -1], [-6, 2, 3]])
    check_everywhere(lambda d, i: xgather.onnx.gather_elements(d, i, 0, **kw), data, el_idx,
                     lambda d, i: ref.gather_elements(d, i, 0, oob=mode, fill=fill))


def test_promise_in_bounds_matches_in_range():
    data, idx = _data((6, 2)), np.array([5, -6, 0, -1])
    f = jax.jit(lambda d, i: xgather.onnx.gather(d, i, mode="promise_in_bounds"))
    assert_same(f(data, idx), ref.gather(data, idx))


def test_default_mode_context_and_env():
    data, idx = _data((3,)), np.array([0, 7])
    with xgather.default_mode("fill"):
        assert_same(xgather.onnx.gather(data, idx), ref.gather(data, idx, oob="fill"))
        # An explicit mode still wins.
        with pytest.raises(xgather.OutOfBoundsError):
            xgather.onnx.gather(data, idx, mode="error")
    with pytest.raises(xgather.OutOfBoundsError):
        xgather.onnx.gather(data, idx)


def test_set_default_mode_is_process_wide():
    """set_default_mode reaches every thread; default_mode stays in its own thread."""
    import threading
    data, idx = _data((3,)), np.array([0, 7])
    seen = []

    def in_thread():
        try:
            seen.append(np.asarray(xgather.onnx.gather(data, idx)))
        except xgather.OutOfBoundsError as e:
            seen.append(e)

    def run():
        seen.clear()
        t = threading.Thread(target=in_thread)
        t.start()
        t.join()
        return seen[0]

    try:
        xgather.set_default_mode("fill")
        assert_same(run(), ref.gather(data, idx, oob="fill"))
        with xgather.default_mode("clip"):  # this thread only: a block overrides it here
            assert_same(xgather.onnx.gather(data, idx), ref.gather(data, idx, oob="clip"))
            assert_same(run(), ref.gather(data, idx, oob="fill"))
    finally:
        xgather.set_default_mode(None)
    assert isinstance(run(), xgather.OutOfBoundsError)


def test_default_mode_from_environment():
    import subprocess
    import sys
    code = ("import numpy as np, xgather; "
            "print(xgather.onnx.gather(np.arange(3.0, dtype=np.float32), [0, 5]).tolist())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**__import__("os").environ, "XGATHER_MODE": "clip"}, check=True)
    assert out.stdout.strip() == "[0.0, 2.0]"


def test_same_shapes_do_not_retrace():
    traces = []
    data, idx = _data((5, 3)), np.array([1, 2])

    def f(d, i):
        traces.append(1)
        return xgather.onnx.gather(d, i, 1, mode="clip")

    jf = jax.jit(f)
    for _ in range(3):
        jf(data, idx)
        xgather.onnx.gather(data, idx, 1)
    assert len(traces) == 1
    plan = xgather.explain(xgather.onnx.gather, data, idx, 1)
    from xgather._apply import program
    from xgather._gather import Call
    fn = program(Call(plan, "promise_in_bounds"), False)
    assert fn._cache_size() == 1
    xgather.onnx.gather(data + 1, idx - 1, 1)
    assert fn._cache_size() == 1


def test_explain_shows_the_lowering():
    plan = xgather.explain(xgather.onnx.gather_nd, jax.ShapeDtypeStruct((2, 3, 4), np.float32),
                           jax.ShapeDtypeStruct((2, 5, 1), np.int64), batch_dims=1)
    assert plan.out_shape == (2, 5, 4) and plan.batch_dims == 1
    assert plan.dimension_numbers.collapsed_slice_dims == (0,)
    assert plan.slice_sizes == (1, 4)
    assert "lowering: vmap over 1 batch dim" in str(plan)
    assert hash(plan) == hash(xgather.explain(
        xgather.onnx.gather_nd, np.zeros((2, 3, 4), np.float32), np.zeros((2, 5, 1), np.int64),
        batch_dims=1))


def test_explain_shows_which_lowering_is_taken():
    def ex(*args, **kwargs):
        with xgather.lowering("cpu"):  # XLA:CPU's choices (tests/test_paths.py: the others)
            return xgather.explain(*args, **kwargs)
    row = ex(xgather.onnx.gather, np.zeros((4, 5, 6)), np.zeros(3, np.int64), axis=0)
    inner = ex(xgather.onnx.gather, np.zeros((4, 5, 6)), np.zeros(3, np.int64), axis=2)
    elems = ex(xgather.onnx.gather_elements, np.zeros((4, 5)), np.zeros((4, 2), np.int64), 1)
    batched = ex(xgather.openvino.gather, np.zeros((4, 5, 6)), np.zeros((4, 3), np.int64), 1, 1)
    assert row.lowering == "vmap" and row.index_broadcast == ()
    assert inner.lowering == "vmap+row_batching" and inner.index_broadcast == (4, 5)
    assert inner.dimension_numbers.operand_batching_dims == (0, 1)
    assert "indices broadcast over leading dims (4, 5)" in str(inner)
    assert elems.lowering == "batching_dims"
    assert elems.dimension_numbers.operand_batching_dims == (0,)
    assert batched.lowering == "vmap" and batched.batch_dims == 1
    assert "lowering: vmap over 1 batch dim(s)" in str(batched)


def test_explain_names_the_calls_bound_check_and_checks_its_options():
    data, idx = np.zeros((3, 4), np.float32), np.array([1, 2])
    notes = {kw.get("mode"): xgather.explain(xgather.onnx.gather, data, idx, **kw).notes[0]
             for kw in ({}, {"mode": "clip"}, {"mode": "fill", "fill_value": 2.0},
                        {"mode": "promise_in_bounds"})}
    assert notes[None].startswith('bound check (mode="error"): ')
    assert notes["clip"] == ('bound check: none (mode="clip": an out-of-range index reads '
                             'the nearest end)')
    assert notes["fill"] == ('bound check: none (mode="fill": an out-of-range index gives '
                             'fill_value)')
    assert "you promise" in notes["promise_in_bounds"]
    zeros = xgather.explain(xgather.openvino.gather, data, idx, 0).notes[0]
    assert zeros == ('bound check: none (mode="fill": an out-of-range index gives zeros, '
                     "the spec's rule)")
    with xgather.default_mode("clip"):  # the mode in force, as the call takes it
        assert xgather.explain(xgather.onnx.gather, data, idx).notes[0] == notes["clip"]
    with xgather.default_mode("fill"):  # ONNX's fill by choice, not its spec's rule
        assert xgather.explain(xgather.onnx.gather, data, idx).notes[0] == notes["fill"]
    with pytest.raises(xgather.XGatherTypeError, match="fill_value for float32 data must be"):
        xgather.explain(xgather.onnx.gather, data, idx, mode="fill", fill_value="x")
