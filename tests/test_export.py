"""Export with jax2onnx, run in onnxruntime, compare with NumPy loops and with eager xgather."""

from __future__ import annotations

import functools
import importlib
import logging
import re
import sys

import jax
import numpy as np
import pytest

pytest.importorskip("jax2onnx", reason="jax2onnx not installed (xgather[export])")
pytest.importorskip("flax", reason="jax2onnx's plugins import flax")
onnxruntime = pytest.importorskip("onnxruntime")
import onnx  # noqa: E402

import xgather  # noqa: E402
import xgather.export  # noqa: E402
from tests import reference  # noqa: E402
from tests.helpers import rerun_with_x64  # noqa: E402

# jax2onnx logs a warning for each of its plugin trees whose framework is absent.
logging.getLogger("jax2onnx").setLevel(logging.ERROR)


rng = np.random.default_rng(0)
DATA = rng.normal(size=(2, 3, 4)).astype(np.float32)
# The x64 rerun (test_error_default_with_x64_on) changes the dtypes of the models, not the
# opsets: it takes the newest one.
OPSETS = (21,) if jax.config.jax_enable_x64 else (17, 21)


def _i(x):
    return np.asarray(x, np.int32)  # with x64 off, jax2onnx exports int32 index inputs


def _ref(fn, **fixed):
    return lambda d, i, oob, neg, fill: fn(d, i, oob=oob, negative=neg, fill=fill, **fixed)


# id: (xgather op and its positional attributes, NumPy reference, indices with some out of
# range, in-range indices, the spec's default for out of range, whether negative_indices=
# is an option, the ONNX node the default exports as)
OPS = {
    "onnx.gather": (lambda: functools.partial(xgather.onnx.gather, axis=1),
                    _ref(reference.gather, axis=1), _i([[0, -1, 5], [-4, 2, 1]]),
                    _i([[0, -1, 2], [-3, 2, 1]]), "error", True, ("Gather", "axis", 1)),
    "onnx.gather_nd": (lambda: functools.partial(xgather.onnx.gather_nd, batch_dims=1),
                       _ref(reference.gather_nd, batch_dims=1), _i([[[0, 1], [-1, 9]], [[2, 3],
                                                                    [-4, -4]]]),
                       _i([[[0, 1], [-1, 3]], [[2, 3], [-3, -4]]]), "error", True,
                       ("GatherND", "batch_dims", 1)),
    "onnx.gather_elements": (lambda: functools.partial(xgather.onnx.gather_elements, axis=2),
                             _ref(reference.gather_elements, axis=2),
                             _i(rng.integers(-6, 6, size=(2, 3, 3))),
                             _i(rng.integers(-4, 4, size=(2, 3, 3))), "error", True,
                             ("GatherElements", "axis", 2)),
    "openvino.gather": (lambda: functools.partial(xgather.openvino.gather, axis=2, batch_dims=1),
                        _ref(reference.gather, axis=2, batch_dims=1),
                        _i([[0, -1, 7], [3, 2, -5]]), _i([[0, -1, 3], [3, 2, -4]]), "fill",
                        True, None),
    "openvino.gather_nd": (lambda: xgather.openvino.gather_nd, _ref(reference.gather_nd),
                           _i([[0, 1], [-1, 9], [-3, 0]]), _i([[0, 1], [-1, 2], [1, 0]]),
                           "error", True, ("GatherND", "batch_dims", 0)),
    "openvino.gather_elements": (lambda: functools.partial(xgather.openvino.gather_elements,
                                                           axis=1),
                                 _ref(reference.gather_elements, axis=1),
                                 _i(rng.integers(-5, 5, size=(2, 3, 4))),
                                 _i(rng.integers(-3, 3, size=(2, 3, 4))), "error", True,
                                 ("GatherElements", "axis", 1)),
    "bnns.gather_nd": (lambda: xgather.bnns.gather_nd, _ref(reference.gather_nd),
                       _i([[0, 1], [-1, 1], [1, 3]]), _i([[0, 1], [1, 2]]), "error", False,
                       ("GatherND", "batch_dims", 0)),
    "bnns.gather": (lambda: functools.partial(xgather.bnns.gather, axis=1),
                    _ref(reference.gather, axis=1), _i([[0, -1, 5], [2, 1, 3]]),
                    _i([[0, 1, 2]]), "error", False, ("Gather", "axis", 1)),
    "bnns.gather_along_axis": (lambda: functools.partial(xgather.bnns.gather_along_axis, axis=2),
                               _ref(reference.gather_elements, axis=2),
                               _i(rng.integers(-5, 6, size=(2, 3, 4))),
                               _i(rng.integers(0, 4, size=(2, 3, 4))), "error", False,
                               ("GatherElements", "axis", 2)),
    "labview.gather": (lambda: functools.partial(xgather.labview.gather, axis=1),
                       _ref(reference.gather, axis=1), _i([[0, -1, 5]]), _i([[0, -1, 2]]),
                       "error", True, ("Gather", "axis", 1)),
}

# (mode, negative_indices, which indices): the option sets exported for every op.
MODES = [("clip", True, "oob"), ("fill", True, "oob"), ("promise_in_bounds", True, "ok"),
         ("clip", False, "oob"), ("fill", False, "oob"), (None, True, "default")]


def _export(fn, args, opset):
    model = xgather.export.to_onnx(fn, list(args), opset=opset)
    onnx.checker.check_model(model)
    return model


def _ort(model, args):
    sess = onnxruntime.InferenceSession(model.SerializeToString(),
                                        providers=["CPUExecutionProvider"])
    return sess.run(None, dict(zip([x.name for x in sess.get_inputs()], args, strict=True)))[0]


def _nodes(model):
    yield from model.graph.node
    for fn in model.functions:
        yield from fn.node


def _case(op_id, mode, neg, which):
    make, ref, oob, ok, default, has_neg, node = OPS[op_id]
    indices = ok if which != "oob" else oob
    kwargs = {} if mode is None else {"mode": mode}
    fill = 0
    if mode == "fill":
        kwargs["fill_value"] = fill = -7.5
    if has_neg and not neg:
        kwargs["negative_indices"] = False
    if not has_neg:
        neg = False
    oob_rule = {"clip": "clip", "fill": "fill"}.get(mode or default, "error")
    if which == "default" and default == "fill":
        indices = oob  # OpenVINO Gather: out of range gives zeros
    fn = functools.partial(make(), **kwargs)
    want = ref(DATA, np.asarray(indices), oob_rule, neg, fill)
    return fn, indices, want, node


CASES = [(op, m) for op in OPS for m in MODES if OPS[op][5] or m[1]]


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("op_id, options", CASES,
                         ids=[f"{op}-{m[0]}-neg{int(m[1])}" for op, m in CASES])
def test_export_runs_in_onnxruntime(op_id, options, opset):
    mode, neg, which = options
    fn, indices, want, node = _case(op_id, mode, neg, which)
    model = _export(fn, (DATA, indices), opset)
    got = _ort(model, (DATA, indices))
    np.testing.assert_array_equal(got, want)
    eager = np.asarray(fn(DATA, indices))  # after the export, in the same process
    np.testing.assert_array_equal(eager, want)
    types = [n.op_type for n in _nodes(model)]
    assert "BitCast" not in types
    if which == "default" and node is not None:
        op_type, attr, value = node
        (gather,) = [n for n in _nodes(model) if n.op_type == op_type]
        assert {a.name: onnx.helper.get_attribute_value(a) for a in gather.attribute} == \
            {attr: value}


@pytest.mark.parametrize("opset", range(17, 22))
@pytest.mark.parametrize("op_id", ["onnx.gather", "onnx.gather_nd", "onnx.gather_elements"])
def test_onnx_ops_export_as_the_onnx_node_at_every_opset(op_id, opset):
    fn, indices, want, (op_type, _, _) = _case(op_id, None, True, "default")
    model = _export(fn, (DATA, indices), opset)
    assert [n.op_type for n in _nodes(model)] in ([op_type], ["Cast", op_type])
    assert model.opset_import[0].version == opset
    np.testing.assert_array_equal(_ort(model, (DATA, indices)), want)


# --- mode="error", the spec default of every op but OpenVINO Gather ------------------------------
#
# The exported check is onnxruntime's: its Gather, GatherND and GatherElements kernels reject an
# index outside [-s, s-1] and name the failing node. Every assertion is against the NumPy loops
# of tests/reference.py and an onnxruntime run. test_error_default_with_x64_on reruns these tests
# with x64 on: the models then take float64 data and int64 indices.

X64 = bool(jax.config.jax_enable_x64)
IDX = np.int64 if X64 else np.int32
DATA_X = DATA.astype(np.float64 if X64 else np.float32)
PREMAP = ["Less", "Max", "Sub", "Where"]  # where the range is [0, s-1]: a negative i becomes i - s
CAST = [] if X64 else ["Cast"]  # GatherND takes int64 indices only
GUARD = None  # no node computes the op: the guard Gather(Range(0, s, 1), indices), then the gather
P = functools.partial


def _refn(fn, *fixed, fold=None):
    def ref(d, i, negative):
        out = fn(d, i, *fixed, negative=negative)
        return out if fold is None else out.reshape(fold)
    return ref


# id: (op with its attributes, NumPy reference (data, indices, negative), in-range indices, the
# sizes of the indexed axes (one per index component), whether negative indices count from the
# end, the node types of the export (GUARD: see above), the op as the failing node names it)
ERROR_DEFAULT = {
    "onnx.gather": (P(xgather.onnx.gather, axis=1), _refn(reference.gather, 1),
                    [[0, -1, 2], [-3, 2, 1]], (3,), True, ["Gather"], "onnx.Gather-13"),
    "onnx.gather-nonneg": (P(xgather.onnx.gather, axis=1, negative_indices=False),
                           _refn(reference.gather, 1), [[0, 1, 2], [2, 2, 1]], (3,), False,
                           PREMAP + ["Gather"], "onnx.Gather-13"),
    "onnx.gather_nd": (P(xgather.onnx.gather_nd, batch_dims=1), _refn(reference.gather_nd, 1),
                       [[[0, 1], [-1, 3]], [[2, 3], [-3, -4]]], (3, 4), True,
                       CAST + ["GatherND"], "onnx.GatherND-13"),
    "onnx.gather_nd-nonneg": (P(xgather.onnx.gather_nd, batch_dims=1, negative_indices=False),
                              _refn(reference.gather_nd, 1), [[[0, 1], [1, 3]], [[2, 3], [0, 0]]],
                              (3, 4), False, PREMAP + CAST + ["GatherND"], "onnx.GatherND-13"),
    "onnx.gather_elements": (P(xgather.onnx.gather_elements, axis=2),
                             _refn(reference.gather_elements, 2),
                             rng.integers(-4, 4, size=(2, 3, 3)), (4,), True, ["GatherElements"],
                             "onnx.GatherElements-13"),
    "onnx.gather_elements-nonneg": (P(xgather.onnx.gather_elements, axis=2,
                                      negative_indices=False),
                                    _refn(reference.gather_elements, 2),
                                    rng.integers(0, 4, size=(2, 3, 3)), (4,), False,
                                    PREMAP + ["GatherElements"], "onnx.GatherElements-13"),
    "labview.gather": (P(xgather.labview.gather, axis=1), _refn(reference.gather, 1),
                       [[0, -1, 2]], (3,), True, ["Gather"], "labview.Gather"),
    "labview.gather-nonneg": (P(xgather.labview.gather, axis=1, negative_indices=False),
                              _refn(reference.gather, 1), [[0, 1, 2]], (3,), False,
                              PREMAP + ["Gather"], "labview.Gather"),
    "openvino.gather_nd": (P(xgather.openvino.gather_nd, batch_dims=1),
                           _refn(reference.gather_nd, 1), [[[0, 1], [-1, 3]], [[2, 3], [-3, -4]]],
                           (3, 4), True, CAST + ["GatherND"], "openvino.GatherND-8"),
    "openvino.gather_nd-5": (P(xgather.openvino.gather_nd, batch_dims=2, version=5),
                             _refn(reference.gather_nd, 2, fold=(6,)),
                             [[[0], [-1], [3]], [[-4], [2], [1]]], (4,), True,
                             CAST + ["GatherND", "Reshape"], "openvino.GatherND-5"),
    "openvino.gather_nd-nonneg": (P(xgather.openvino.gather_nd, batch_dims=1,
                                    negative_indices=False), _refn(reference.gather_nd, 1),
                                  [[[0, 1], [1, 3]], [[2, 3], [0, 0]]], (3, 4), False,
                                  PREMAP + CAST + ["GatherND"], "openvino.GatherND-8"),
    "openvino.gather_elements": (P(xgather.openvino.gather_elements, axis=1),
                                 _refn(reference.gather_elements, 1),
                                 rng.integers(-3, 3, size=(2, 3, 4)), (3,), True,
                                 ["GatherElements"], "openvino.GatherElements-6"),
    "openvino.gather_elements-nonneg": (P(xgather.openvino.gather_elements, axis=1,
                                          negative_indices=False),
                                        _refn(reference.gather_elements, 1),
                                        rng.integers(0, 3, size=(2, 3, 4)), (3,), False,
                                        PREMAP + ["GatherElements"], "openvino.GatherElements-6"),
    # OpenVINO Gather defaults to zeros; mode="error" chosen explicitly exports as well.
    "openvino.gather-error": (P(xgather.openvino.gather, axis=1, mode="error"),
                              _refn(reference.gather, 1), [[0, -1, 2]], (3,), True, ["Gather"],
                              "openvino.Gather-8"),
    "openvino.gather-error-batch": (P(xgather.openvino.gather, axis=2, batch_dims=1, mode="error"),
                                    _refn(reference.gather, 2, 1), [[0, -1, 3], [3, 2, -4]], (4,),
                                    True, GUARD, "openvino.Gather-8"),
    "bnns.gather_nd": (xgather.bnns.gather_nd, _refn(reference.gather_nd), [[0, 1], [1, 2]],
                       (2, 3), False, PREMAP + CAST + ["GatherND"], "bnns.GatherND"),
    "bnns.gather_nd-batch": (P(xgather.bnns.gather_nd, batch_dimension_count=1),
                             _refn(reference.gather_nd, 1), [[[0, 1], [2, 3]], [[1, 0], [2, 2]]],
                             (3, 4), False, PREMAP + CAST + ["GatherND"], "bnns.GatherND"),
    "bnns.gather": (P(xgather.bnns.gather, axis=1), _refn(reference.gather, 1), [[0, 1, 2]], (3,),
                    False, PREMAP + ["Gather"], "bnns.Gather"),
    "bnns.gather-batch": (P(xgather.bnns.gather, axis=2, batch_dimension_count=1),
                          _refn(reference.gather, 2, 1), [[0, 3, 1], [2, 2, 0]], (4,), False, GUARD,
                          "bnns.Gather"),
    "bnns.gather_along_axis": (P(xgather.bnns.gather_along_axis, axis=2),
                               _refn(reference.gather_elements, 2),
                               rng.integers(0, 4, size=(2, 3, 4)), (4,), False,
                               PREMAP + ["GatherElements"], "bnns.GatherAlongAxis"),
}

# Each kind of bad index, given the size s of its axis.
BAD = {"too_large": lambda s: s, "far_above": lambda s: 1000, "below_minus_s": lambda s: -s - 1,
       "negative": lambda s: -1, "dtype_min": lambda s: np.iinfo(IDX).min,
       "dtype_max": lambda s: np.iinfo(IDX).max}
BAD_CASES = [(op, kind, where) for op in ERROR_DEFAULT for kind in BAD
             for where in ("first", "last")
             if kind != "negative" or not ERROR_DEFAULT[op][4]]  # -1 is in range there


def _run_x(model, args):
    """onnxruntime on ``args``, which must have the dtypes the model declares."""
    declared = [onnx.helper.tensor_dtype_to_np_dtype(x.type.tensor_type.elem_type)
                for x in model.graph.input]
    assert [np.asarray(a).dtype for a in args] == declared
    return _ort(model, args)


@functools.cache
def _error_model(op_id, opset):
    fn, _, ok, *_ = ERROR_DEFAULT[op_id]
    model = xgather.export.to_onnx(fn, [DATA_X, np.asarray(ok, IDX)], opset=opset,
                                   enable_double_precision=X64)
    onnx.checker.check_model(model)
    return model


def _guards(model):
    """The guard nodes: Gathers from a Range."""
    ranges = {n.output[0] for n in model.graph.node if n.op_type == "Range"}
    return [n for n in model.graph.node if n.op_type == "Gather" and n.input[0] in ranges]


def _message(node_types, shown):
    """What onnxruntime's error says of the bad index ``shown``."""
    node = "Gather" if node_types is GUARD else next(
        t for t in node_types if t in ("Gather", "GatherND", "GatherElements"))
    return {"Gather": f"idx={shown} must be within the inclusive range",
            "GatherND": f"invalid index found, index = {shown}",
            "GatherElements": "Out of range value in index tensor"}[node]


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("op_id", list(ERROR_DEFAULT))
def test_error_default_exports(op_id, opset):
    _, ref, ok, bounds, negative, node_types, _ = ERROR_DEFAULT[op_id]
    model = _error_model(op_id, opset)
    types = [n.op_type for n in _nodes(model)]
    assert "BitCast" not in types
    if node_types is GUARD:
        assert len(_guards(model)) == len(bounds), types
    else:
        assert types == node_types
    ok = np.asarray(ok, IDX)
    np.testing.assert_array_equal(_run_x(model, (DATA_X, ok)), ref(DATA_X, ok, negative))


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("op_id, kind, where", BAD_CASES)
def test_error_default_rejects_in_onnxruntime(op_id, kind, where, opset):
    _, ref, ok, bounds, negative, node_types, label = ERROR_DEFAULT[op_id]
    bad = np.array(ok, IDX).ravel()
    pos = 0 if where == "first" else bad.size - 1
    s = bounds[pos % len(bounds)]  # the size of the axis this index addresses
    bad[pos] = value = BAD[kind](s)
    bad = bad.reshape(np.shape(ok))
    with pytest.raises(IndexError):  # out of the spec's range
        ref(DATA_X, bad, negative)
    # onnxruntime shows the index as given, except a negative one where the range is [0, s-1]:
    # it reaches the node as i - s (saturated at the dtype's minimum).
    shown = value if negative or value >= 0 else max(value, np.iinfo(IDX).min + s) - s
    said = re.escape(_message(node_types, shown))
    pattern = rf"Name:'xgather_\d+ {re.escape(label)}[^']*'.*{said}"
    with pytest.raises(Exception, match=pattern):
        _run_x(_error_model(op_id, opset), (DATA_X, bad))


UNSIGNED = [np.uint8, np.uint32] + ([np.uint64] if X64 else [])
# GatherElements-6 takes only int32/int64 indices (its T_IND): tests/test_openvino.py.
UNSIGNED_OPS = {"openvino.gather_nd": [[[0, 1], [2, 3]], [[2, 3], [0, 0]]],
                "openvino.gather-error": [[0, 2, 1]],
                "openvino.gather-error-batch": [[0, 3, 1], [3, 2, 0]]}


@pytest.mark.parametrize("dtype", UNSIGNED, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("op_id", list(UNSIGNED_OPS))
def test_error_default_unsigned_indices(op_id, dtype):
    fn, ref, _, bounds, _, node_types, label = ERROR_DEFAULT[op_id]
    ok = np.asarray(UNSIGNED_OPS[op_id], dtype)
    model = xgather.export.to_onnx(fn, [DATA_X, ok], opset=21, enable_double_precision=X64)
    np.testing.assert_array_equal(_run_x(model, (DATA_X, ok)), ref(DATA_X, ok, True))
    top = np.iinfo(dtype).max
    for value, shown in [(bounds[-1], bounds[-1]), (top, min(top, np.iinfo(np.int64).max))]:
        bad = ok.copy().ravel()
        bad[-1] = value
        bad = bad.reshape(ok.shape)
        with pytest.raises(IndexError):
            ref(DATA_X, bad, True)
        with pytest.raises(Exception, match=re.escape(_message(node_types, shown))):
            _run_x(model, (DATA_X, bad))


@pytest.mark.parametrize("opset", OPSETS)
def test_error_default_under_vmap_exports_the_guard(opset):
    # Under vmap the ONNX node gives way to the plain form of "error": the guard, then the gather.
    fn = jax.vmap(P(xgather.onnx.gather, axis=0))  # per example: data (3, 4), indices (2,)
    ok = np.asarray([[0, -1], [2, -3]], IDX)
    model = xgather.export.to_onnx(fn, [DATA_X, ok], opset=opset, enable_double_precision=X64)
    assert len(_guards(model)) == 1
    want = np.stack([reference.gather(d, i, 0) for d, i in zip(DATA_X, ok, strict=True)])
    np.testing.assert_array_equal(_run_x(model, (DATA_X, ok)), want)
    for value in (3, -4, 1000):
        bad = ok.copy()
        bad[1, 1] = value
        with pytest.raises(IndexError):
            reference.gather(DATA_X[1], bad[1], 0)
        with pytest.raises(Exception, match=rf"onnx.Gather-13.*idx={value} must be within"):
            _run_x(model, (DATA_X, bad))


def test_error_default_tuples_under_vmap():
    # One guard per index component, each with the size of its own axis.
    fn = jax.vmap(xgather.bnns.gather_nd, in_axes=(None, 0))  # indices (2, 1, 2) into (2, 3, 4)
    ok = np.asarray([[[0, 2]], [[1, 1]]], IDX)
    model = xgather.export.to_onnx(fn, [DATA_X, ok], opset=21, enable_double_precision=X64)
    assert len(_guards(model)) == 2
    want = np.stack([reference.gather_nd(DATA_X, i, negative=False) for i in ok])
    np.testing.assert_array_equal(_run_x(model, (DATA_X, ok)), want)
    for where, value, shown in [((1, 0, 1), -1, -4), ((1, 0, 1), 3, 3), ((0, 0, 0), 2, 2),
                                ((0, 0, 0), -1, -3)]:
        bad = ok.copy()
        bad[where] = value
        with pytest.raises(IndexError):
            reference.gather_nd(DATA_X, bad[where[0]], negative=False)
        with pytest.raises(Exception, match=rf"bnns.GatherND: index component {where[2]} .*"
                                            rf"idx={shown} must be within"):
            _run_x(model, (DATA_X, bad))


@pytest.mark.parametrize("op_id", ["onnx.gather", "bnns.gather-batch", "bnns.gather_nd-batch"])
def test_error_default_under_jvp(op_id):
    fn, ref, ok, bounds, negative, _, label = ERROR_DEFAULT[op_id]
    ok = np.asarray(ok, IDX)
    tangent = (DATA_X * 3 - 1).astype(DATA_X.dtype)

    def jvp(d, t, i):
        return jax.jvp(lambda dd: fn(dd, i), (d,), (t,))[1]

    model = xgather.export.to_onnx(jvp, [DATA_X, tangent, ok], opset=21,
                                   enable_double_precision=X64)
    assert _guards(model)  # the node, if any, gave way to the guard
    np.testing.assert_array_equal(_run_x(model, (DATA_X, tangent, ok)),
                                  ref(tangent, ok, negative))
    bad = ok.copy().ravel()
    bad[-1] = bounds[-1]
    with pytest.raises(Exception, match=rf"{re.escape(label)}.*idx={bounds[-1]} must be within"):
        _run_x(model, (DATA_X, tangent, bad.reshape(ok.shape)))


@pytest.mark.parametrize("op_id", ["onnx.gather", "labview.gather"])
def test_error_default_under_grad(op_id):
    # Reverse mode exports where jax2onnx lowers the scatter-add (a gather along axis 0 here).
    fn = {"onnx.gather": P(xgather.onnx.gather, axis=0),
          "labview.gather": P(xgather.labview.gather, axis=0, lda_coeff=-0.5)}[op_id]
    scale = -0.5 if op_id == "labview.gather" else 1.0
    ok = np.asarray([0, -1, 1, 1], IDX)
    cot = (np.arange(4 * 3 * 4).reshape(4, 3, 4) % 5 - 2).astype(DATA_X.dtype)

    def grad(d, i):
        return jax.grad(lambda dd: (fn(dd, i) * cot).sum())(d)

    model = xgather.export.to_onnx(grad, [DATA_X, ok], opset=21, enable_double_precision=X64)
    assert _guards(model)
    np.testing.assert_array_equal(_run_x(model, (DATA_X, ok)),
                                  reference.scatter_add_take(DATA_X.shape, ok, cot, 0,
                                                             scale=scale))
    for value in (2, -3):
        with pytest.raises(Exception, match=rf"idx={value} must be within"):
            _run_x(model, (DATA_X, np.asarray([0, -1, value, 1], IDX)))


@pytest.mark.parametrize("op_id", ["onnx.gather", "labview.gather"])
def test_float16_gradient_exports_summed_in_float32(op_id):
    # The exported gradient sums in float32 and rounds once, as xgather._grad does.
    fn = {"onnx.gather": P(xgather.onnx.gather, axis=0),
          "labview.gather": P(xgather.labview.gather, axis=0, lda_coeff=-0.5)}[op_id]
    scale = -0.5 if op_id == "labview.gather" else 1.0
    rng = np.random.default_rng(3)
    ok = rng.integers(-2, 2, 300).astype(IDX)  # DATA_X has 2 rows
    cot = (rng.integers(64, 129, (300, 3, 4)) / 16).astype(np.float32)
    data = DATA_X.astype(np.float16)

    def grad(d, i):
        return jax.grad(lambda dd: (fn(dd, i).astype(np.float32) * cot).sum())(d)

    model = xgather.export.to_onnx(grad, [data, ok], opset=21, enable_double_precision=X64)
    got = _run_x(model, (data, ok))
    exact = reference.scatter_add_take(data.shape, ok, cot.astype(np.float64), 0, scale=scale)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, exact.astype(np.float16))
    with pytest.raises(Exception, match=r"idx=2 must be within"):
        _run_x(model, (data, np.where(np.arange(300) == 7, 2, ok).astype(IDX)))


@pytest.mark.parametrize("training", [True, False])
def test_error_default_labview_jvp(training):
    # lda coeff and training? shape the tangent in the export as in xgather.labview.
    fn = P(xgather.labview.gather, axis=1, lda_coeff=0.5, training=training)
    ok = np.asarray([0, -3, 2], IDX)
    tangent = (DATA_X * 3 - 1).astype(DATA_X.dtype)

    def jvp(d, t, i):
        return jax.jvp(lambda dd: fn(dd, i), (d,), (t,))

    model = xgather.export.to_onnx(jvp, [DATA_X, tangent, ok], opset=21,
                                   enable_double_precision=X64)
    sess = onnxruntime.InferenceSession(model.SerializeToString(),
                                        providers=["CPUExecutionProvider"])
    names = [x.name for x in sess.get_inputs()]
    out, tan = sess.run(None, dict(zip(names, (DATA_X, tangent, ok), strict=True)))
    np.testing.assert_array_equal(out, reference.gather(DATA_X, ok, 1))
    np.testing.assert_array_equal(tan, reference.gather(tangent, ok, 1) * (0.5 if training else 0))
    with pytest.raises(Exception, match=r"labview.Gather.*idx=-4 must be within"):
        sess.run(None, dict(zip(names, (DATA_X, tangent, np.asarray([0, -4, 2], IDX)),
                                strict=True)))


def test_error_default_empty_axis():
    # No index is in range on an axis of size 0: any index fails, and an empty one gives
    # an empty result.
    fn = P(xgather.bnns.gather, axis=1, batch_dimension_count=1)
    data = np.zeros((2, 0, 4), DATA_X.dtype)
    idx = np.zeros((2, 3), IDX)
    model = xgather.export.to_onnx(fn, [data, idx], opset=21, enable_double_precision=X64)
    with pytest.raises(IndexError):
        reference.gather(data, idx, 1, 1, negative=False)
    with pytest.raises(Exception, match=r"bnns.Gather.*idx=0 must be within"):
        _run_x(model, (data, idx))
    empty = np.zeros((2, 0), IDX)
    model = xgather.export.to_onnx(fn, [data, empty], opset=21, enable_double_precision=X64)
    assert _run_x(model, (data, empty)).shape == (2, 0, 4)


@pytest.mark.parametrize("op", [P(xgather.onnx.gather, axis=1),
                                P(xgather.labview.gather, axis=1, negative_indices=False),
                                P(xgather.openvino.gather_nd, batch_dims=1)],
                         ids=["onnx.gather", "labview.gather-nonneg", "openvino.gather_nd"])
def test_error_default_constant_indices_are_checked_at_export(op):
    bad = np.asarray([[0, -4]] if op.func is not xgather.openvino.gather_nd
                     else [[[0, 1]], [[3, 0]]], IDX)
    with pytest.raises(xgather.OutOfBoundsError):
        xgather.export.to_onnx(lambda d: op(d, bad), [DATA_X], opset=21,
                               enable_double_precision=X64)


@pytest.mark.parametrize("mode", ["clip", "fill"])
def test_wide_indices_clip_and_fill_export(mode):
    # In the x64 run the indices are int64: the export gathers on int32 ones once they are
    # in range (no platform-dependent narrowing, which jax2onnx cannot lower).
    fn = P(xgather.bnns.gather, axis=2, batch_dimension_count=1, mode=mode, fill_value=-7.5)
    idx = np.asarray([[0, -1, 5], [3, 2, 1000]], IDX)
    model = xgather.export.to_onnx(fn, [DATA_X, idx], opset=21, enable_double_precision=X64)
    np.testing.assert_array_equal(_run_x(model, (DATA_X, idx)),
                                  reference.gather(DATA_X, idx, 2, 1, negative=False, oob=mode,
                                                   fill=-7.5))


@pytest.mark.parametrize("op", ["gather", "gather_nd"])
def test_wide_indices_unsigned_fill_exports(op):
    # OpenVINO's index types include uint64 (the x64 run): the fill's select runs on int64
    # there, since onnxruntime has no uint64 Where.
    unsigned = np.uint64 if X64 else np.uint32
    idx = np.asarray([0, 2, 7, np.iinfo(unsigned).max], unsigned)
    fn = (P(xgather.openvino.gather, axis=0) if op == "gather" else
          lambda d, i: xgather.openvino.gather_nd(d, i[:, None], mode="fill"))
    model = xgather.export.to_onnx(fn, [DATA_X, idx], opset=21, enable_double_precision=X64)
    want = reference.gather(DATA_X, idx.astype(object), 0, oob="fill")
    np.testing.assert_array_equal(_run_x(model, (DATA_X, idx)), want)


def _where_input_types(model):
    """The element types of every ``Where`` node's value inputs (shape inference's)."""
    model = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type
             for v in [*model.graph.value_info, *model.graph.input, *model.graph.output]}
    return {types.get(name) for node in _nodes(model) if node.op_type == "Where"
            for name in node.input[1:]}


@pytest.mark.parametrize("mode", ["clip", "fill", None])
@pytest.mark.parametrize("unsigned", [np.uint8, np.uint16, np.uint32])
def test_no_unsigned_where(mode, unsigned):
    # onnxruntime's Where has no uint64 kernel, nor a uint32 one before 1.31: the plain
    # path selects signed indices (onnxruntime 1.30 failed to load the uint32 model).
    idx = np.asarray([0, 2, 7, np.iinfo(unsigned).max], unsigned)
    model = xgather.export.to_onnx(P(xgather.openvino.gather, axis=0, mode=mode), [DATA, idx],
                                   opset=21)
    unsigned_types = {onnx.TensorProto.UINT8, onnx.TensorProto.UINT16, onnx.TensorProto.UINT32,
                      onnx.TensorProto.UINT64}
    assert not _where_input_types(model) & unsigned_types
    want = reference.gather(DATA, idx.astype(np.int64), 0, oob=mode or "fill")
    np.testing.assert_array_equal(_ort(model, (DATA, idx)), want)


# Functions whose lowering differs by platform: a gather inside the array (row batching on
# a CPU), an element gather and a GatherND of single elements (the linear lowering), a large
# gather whose negative indices are wrapped in a pass of their own, and the defaults.
PLATFORM_CASES = {  # op, its attributes, data and indices shapes, the reference
    "inner-axis": (xgather.onnx.gather, dict(axis=2, mode="clip"), (4, 5, 6), (3,),
                   lambda d, i: reference.gather(d, i, 2, oob="clip")),
    "elements": (xgather.onnx.gather_elements, dict(axis=1, mode="fill"), (4, 5, 6), (4, 3, 6),
                 lambda d, i: reference.gather_elements(d, i, 1, oob="fill")),
    "nd-elements": (xgather.onnx.gather_nd, dict(batch_dims=1, mode="clip"), (4, 5, 6),
                    (4, 7, 2), lambda d, i: reference.gather_nd(d, i, 1, oob="clip")),
    "large-inner": (xgather.onnx.gather, dict(axis=1, mode="fill"), (64, 1024), (512,),
                    lambda d, i: reference.gather(d, i, 1, oob="fill")),
    "default": (xgather.onnx.gather_elements, dict(axis=2), (4, 5, 6), (4, 5, 3),
                lambda d, i: reference.gather_elements(d, i, 2)),
}


@pytest.mark.parametrize("case", sorted(PLATFORM_CASES))
def test_the_graph_is_the_same_wherever_it_is_traced(case):
    op, attrs, dshape, ishape, want = PLATFORM_CASES[case]
    rng = np.random.default_rng(3)
    data = rng.standard_normal(dshape).astype(np.float32)
    s = dshape[-1] if case == "default" else min(dshape[1:])
    idx = rng.integers(-s, s if case == "default" else 2 * s, ishape).astype(np.int32)
    graphs = {}
    for platform in xgather._lower.PLATFORMS:
        for element in xgather._lower.ELEMENT_GATHERS:
            with xgather.lowering(platform, element_gather=element):
                model = _export(lambda d, i: op(d, i, **attrs), (data, idx), 21)
            graphs[platform, element] = model.graph.SerializeToString()
            np.testing.assert_array_equal(_ort(model, (data, idx)), want(data, idx))
    assert len(set(graphs.values())) == 1, sorted(graphs)
    # ... while outside an export the lowering is chosen per platform.
    with xgather.lowering("gpu", element_gather="linear"):
        on_gpu = xgather.explain(op, data, idx, **attrs)
    with xgather.lowering("cpu"):
        on_cpu = xgather.explain(op, data, idx, **attrs)
    assert (on_gpu.platform, on_cpu.platform) == ("gpu", "cpu")
    if case != "default":
        assert (on_gpu.lowering, on_gpu.wrap_pass) != (on_cpu.lowering, on_cpu.wrap_pass)


@pytest.mark.parametrize("dtype, coeff", [(np.float16, None), (np.float32, 0.5)],
                         ids=["float16", "labview"])
@pytest.mark.parametrize("mode", ["clip", "fill"])
def test_forward_mode_exports_on_the_plain_path(dtype, coeff, mode):
    # xgather's own derivative (16-bit sums, LabVIEW's coeff) exports under jvp in the
    # modes that export as plain ops: its indices get no float0 tangent.
    data = DATA.astype(dtype)
    tangent = (DATA * 3 - 1).astype(dtype)
    idx = np.asarray([0, -1, 5, 2], IDX)
    if coeff is None:
        fn = P(xgather.onnx.gather, axis=1, mode=mode)
    else:
        fn = P(xgather.labview.gather, axis=1, mode=mode, lda_coeff=coeff)
    model = xgather.export.to_onnx(lambda d, t, i: jax.jvp(lambda x: fn(x, i), (d,), (t,)),
                                   [data, tangent, idx], opset=21)
    sess = onnxruntime.InferenceSession(model.SerializeToString(),
                                        providers=["CPUExecutionProvider"])
    names = [x.name for x in sess.get_inputs()]
    out, tan = sess.run(None, dict(zip(names, (data, tangent, idx), strict=True)))
    np.testing.assert_array_equal(out, reference.gather(data, idx, 1, oob=mode))
    np.testing.assert_array_equal(tan, reference.gather(tangent, idx, 1, oob=mode)
                                  * (coeff or 1))


@pytest.mark.parametrize("mode", ["clip", "fill", None])
@pytest.mark.parametrize("dshape, ishape", [((2, 3, 4), (0,)), ((0, 3, 4), (2,))],
                         ids=["no-indices", "no-rows"])
def test_empty_results_along_an_inner_axis_export(mode, dshape, ishape):
    data, idx = np.ones(dshape, np.float32), np.zeros(ishape, IDX)
    fn = P(xgather.openvino.gather, axis=1, mode=mode)
    model = xgather.export.to_onnx(fn, [data, idx], opset=21)
    got = _ort(model, (data, idx))
    assert got.shape == dshape[:1] + ishape + dshape[2:] == np.asarray(fn(data, idx)).shape


def test_clip_into_an_empty_axis_fails_at_export_as_eagerly():
    data, idx = np.ones((0, 4), np.float32), np.asarray([0, 1], IDX)
    fn = P(xgather.onnx.gather, axis=0, mode="clip")
    for call in (lambda: fn(data, idx), lambda: xgather.export.to_onnx(fn, [data, idx])):
        with pytest.raises(xgather.XGatherError, match=r'mode="clip" cannot clamp into an axis '
                                                       r"of size 0"):
            call()


def test_jax2onnx_string_dims_export_a_free_batch():
    # jax2onnx's own spelling of a symbolic dim (tests/test_symbolic.py runs such models)
    inputs = [jax.ShapeDtypeStruct((5, 3), np.float32), jax.ShapeDtypeStruct(("B",), IDX)]
    model = xgather.export.to_onnx(P(xgather.onnx.gather, mode="clip"), inputs, opset=21)
    assert model.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "B"
    table = np.arange(15, dtype=np.float32).reshape(5, 3)
    for idx in (np.array([4, -9, 0], IDX), np.array([1, 7], IDX)):
        np.testing.assert_array_equal(_ort(model, (table, idx)),
                                      reference.gather(table, idx, 0, oob="clip"))
    assert xgather.export.to_onnx(P(xgather.onnx.gather, mode="clip"),
                                  [np.ones((5, 3), np.float32), np.zeros(2, IDX)],
                                  opset=np.int64(21)).opset_import[0].version == 21


@pytest.mark.subprocess
@pytest.mark.skipif(X64, reason="already the x64 run")
def test_error_default_with_x64_on():
    rerun_with_x64(__file__, "(error_default or wide_indices) and not x64_on")


def test_promise_in_bounds_exports_as_the_onnx_node():
    fn = functools.partial(xgather.onnx.gather, axis=0, mode="promise_in_bounds")
    model = _export(fn, (DATA, _i([1, -2])), 21)
    assert [n.op_type for n in _nodes(model)] == ["Gather"]


def test_error_mode_with_constant_indices_is_checked_at_export():
    ok, bad = _i([[0, 2]]), _i([[0, 3]])
    model = _export(lambda d: xgather.bnns.gather(d, ok, 1), (DATA,), 21)
    np.testing.assert_array_equal(_ort(model, (DATA,)),
                                  reference.gather(DATA, ok, 1, negative=False))
    with pytest.raises(xgather.OutOfBoundsError, match="bnns.Gather"):
        _export(lambda d: xgather.bnns.gather(d, bad, 1), (DATA,), 21)


def test_eager_and_jit_after_export_use_fresh_traces():
    fn = functools.partial(xgather.onnx.gather, axis=1, mode="clip")
    indices = _i([[0, -1, 5]])
    want = reference.gather(DATA, indices, 1, oob="clip")
    np.testing.assert_array_equal(fn(DATA, indices), want)  # cached before the export
    _export(fn, (DATA, indices), 21)
    np.testing.assert_array_equal(fn(DATA, indices), want)
    np.testing.assert_array_equal(jax.jit(fn)(DATA, indices), want)


def test_export_empties_the_cache_of_jitted_functions():
    # A jitted function traced under jax2onnx's patches (its own primitives, such as
    # 'jax.numpy.full') would fail to compile in a later eager call that reused it.
    fn = functools.partial(xgather.bnns.gather, axis=1, mode="promise_in_bounds")
    indices = _i([[0, 2, 1]])
    fn(DATA, indices)
    assert xgather._apply.program.cache_info().currsize > 0
    _export(fn, (DATA, indices), 21)
    assert xgather._apply.program.cache_info().currsize == 0
    np.testing.assert_array_equal(fn(DATA, indices),
                                  reference.gather(DATA, indices, 1, negative=False))


@pytest.mark.parametrize("path", ["jit as it is", "split arguments"])
def test_a_checked_function_exports_with_the_check_and_runs_after(path, monkeypatch):
    """xgather.checked(step) exports as step does (the check is onnxruntime's), and
    nothing is traced under jax2onnx's patches: the function runs after. Both ways a
    checked call takes its arguments (the second, once flax.nnx is imported)."""
    if path == "jit as it is":
        monkeypatch.delitem(sys.modules, "flax.nnx", raising=False)
    else:
        monkeypatch.setitem(sys.modules, "flax.nnx", importlib.import_module("flax.nnx"))
    f = xgather.checked(lambda d, i: xgather.onnx.gather(d, i, axis=1))
    good, bad = _i([[0, -1, 2]]), _i([[0, 4, 1]])
    want = reference.gather(DATA, good, 1)
    np.testing.assert_array_equal(np.asarray(f(DATA, good)), want)  # traced before
    model = _export(f, (DATA, good), 21)
    assert [n.op_type for n in model.graph.node] == ["Gather"]
    np.testing.assert_array_equal(_ort(model, (DATA, good)), want)
    with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument,
                       match="out of data bounds"):
        _ort(model, (DATA, bad))
    np.testing.assert_array_equal(np.asarray(f(DATA, _i([[1, -2, 0]]))),
                                  reference.gather(DATA, _i([[1, -2, 0]]), 1))
    f(DATA, bad)
    with pytest.raises(xgather.OutOfBoundsError, match=r"index 4 at indices\[0, 1\]"):
        xgather.raise_if_error()
    g = xgather.checked(lambda d, i: xgather.onnx.gather(d, i, axis=1))
    _export(g, (DATA, good), 21)  # traced first under the exporter
    np.testing.assert_array_equal(np.asarray(g(DATA, good)), want)


def test_empty_axis_fill_exports():
    fn = functools.partial(xgather.onnx.gather, axis=1, mode="fill", fill_value=2.5)
    data, indices = np.zeros((2, 0, 4), np.float32), _i([0, -1])
    model = _export(fn, (data, indices), 21)
    want = reference.gather(data, indices, 1, oob="fill", fill=2.5)
    np.testing.assert_array_equal(_ort(model, (data, indices)), want)
    np.testing.assert_array_equal(fn(data, indices), want)


def test_plain_jax2onnx_after_registration():
    import jax2onnx

    xgather.export.register_jax2onnx()
    fn = functools.partial(xgather.onnx.gather_elements, axis=0)
    indices = _i([[1, -1, 0, 2]])
    model = jax2onnx.to_onnx(fn, [DATA[0], indices], opset=21)
    assert [n.op_type for n in _nodes(model)] == ["GatherElements"]
    want = reference.gather_elements(DATA[0], indices, 0)
    np.testing.assert_array_equal(_ort(model, (DATA[0], indices)), want)
    np.testing.assert_array_equal(fn(DATA[0], indices), want)


ELEMENTS = _i([[[1, 0], [0, 0]]] * 3)


def test_model_with_several_ops_jit_and_vmap():
    def model(table, ids, rows):
        emb = xgather.onnx.gather(table, ids)                              # node
        picked = jax.vmap(lambda e, r: xgather.openvino.gather(e, r, 0))(emb, rows)
        return jax.jit(lambda p: xgather.onnx.gather_elements(
            p, ELEMENTS, axis=1, mode="promise_in_bounds"))(picked)

    table = rng.normal(size=(5, 2)).astype(np.float32)
    ids, rows = _i([[4, -5, 1], [0, 2, -1], [3, 3, 0]]), _i([[2, 9], [-1, 0], [1, -3]])
    exported = _ort(_export(model, (table, ids, rows), 17), (table, ids, rows))
    emb = reference.gather(table, ids, 0)
    picked = np.stack([reference.gather(e, r, 0, oob="fill") for e, r in zip(emb, rows,
                                                                              strict=True)])
    want = reference.gather_elements(picked, ELEMENTS, 1)
    np.testing.assert_array_equal(exported, want)
    np.testing.assert_array_equal(model(table, ids, rows), want)


def test_ops_are_restored_after_export():
    before = xgather.onnx.gather
    _export(functools.partial(xgather.onnx.gather, axis=0), (DATA, _i([0])), 21)
    assert xgather.onnx.gather is before


def test_readme_export_example_runs():
    from tests.test_docs import EXAMPLES

    block = next(code for source, _, code in EXAMPLES
                 if source == "docs/onnx.md" and "xgather.export.to_onnx" in code)
    ns: dict = {}
    exec(compile(block, "README-export", "exec"), ns)
    assert [n.op_type for n in ns["model"].graph.node] == ["Gather"]
    np.testing.assert_array_equal(ns["out"], reference.gather(ns["table"], ns["ids"], 0))


@pytest.mark.parametrize("opset", [11, 12, None, "21", True])
def test_model_opsets_before_13_are_an_error(opset):
    """Below 13 xgather's nodes would be invalid (GatherND batch_dims, bfloat16): refused."""
    pattern = (r"^xgather\.export\.to_onnx: opset must be an int, 13 or later .*; "
               rf"got {re.escape(repr(opset))}")
    with pytest.raises(xgather.XGatherError, match=pattern):
        xgather.export.to_onnx(P(xgather.onnx.gather, axis=0), [DATA_X, np.zeros(2, IDX)],
                               opset=opset)


def test_a_jitted_call_exports_on_this_jax():
    """jax2onnx 0.17.1 inlines a jit through jax._src.core.ClosedJaxpr, which jax 0.12
    merged into Jaxpr: xgather.export gives it the public class under the old name."""
    inner = jax.jit(lambda d, i: xgather.onnx.gather(d, i, axis=1) * 2)
    indices = _i([2, -1])
    model = xgather.export.to_onnx(lambda d, i: inner(d, i) + 1, [DATA[0], indices])
    want = reference.gather(DATA[0], indices, 1) * 2 + 1
    np.testing.assert_allclose(_ort(model, (DATA[0], indices)), want, rtol=1e-6)


def _versions_named(message: str) -> None:
    from importlib.metadata import version
    assert f"jax {jax.__version__} with jax2onnx {version('jax2onnx')} cannot export" in message
    assert "pip install 'jax2onnx==0.17.1'" in message


def test_a_jax_without_closed_jaxpr_is_one_clear_error(monkeypatch):
    from xgather import _jaxprivate
    monkeypatch.setattr(xgather.export, "_registered", {})
    monkeypatch.setattr(_jaxprivate, "alias_closed_jaxpr", lambda: False)
    with pytest.raises(xgather.XGatherError, match="neither jax._src.core.ClosedJaxpr") as err:
        xgather.export.to_onnx(lambda d: d, [DATA])
    _versions_named(str(err.value))


def test_an_attribute_error_inside_jax2onnx_is_one_clear_error(monkeypatch):
    import jax2onnx
    inside: dict = {"__name__": "jax2onnx.converter.conversion_api"}
    exec("def to_onnx(*args, **kwargs):\n    raise AttributeError('no ClosedJaxpr')", inside)
    monkeypatch.setattr(jax2onnx, "to_onnx", inside["to_onnx"])
    with pytest.raises(xgather.XGatherError, match="failed inside with AttributeError: no "
                       "ClosedJaxpr") as err:
        xgather.export.to_onnx(lambda d: d, [DATA])
    _versions_named(str(err.value))
    assert isinstance(err.value.__cause__, AttributeError)

    def user_code(*args, **kwargs):  # an AttributeError of the caller's own is left alone
        raise AttributeError("the user's own")
    monkeypatch.setattr(jax2onnx, "to_onnx", user_code)
    with pytest.raises(AttributeError, match="the user's own"):
        xgather.export.to_onnx(lambda d: d, [DATA])
