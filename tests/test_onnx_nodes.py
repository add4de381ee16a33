"""ONNX models in: model opsets, the node adapter and the reference-evaluator ops.

Oracles: onnx's own schema table (op versions), onnxruntime, the expected
outputs of onnx's backend node tests, and the NumPy loops of tests/reference.py.
x64 is off here; ``test_reference_ops_with_x64_on`` reruns the evaluator tests with it on.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import warnings

import jax
import numpy as np
import onnx
import pytest
from onnx import defs, helper
from onnx.reference import ReferenceEvaluator

import xgather
from tests import ort_oracle
from tests import reference as ref
from tests.helpers import assert_same, check_everywhere, rerun_with_x64
from xgather import OutOfBoundsError, XGatherError, XGatherTypeError

ort = pytest.importorskip("onnxruntime")
X64 = bool(jax.config.jax_enable_x64)
OPS = {"Gather": xgather.onnx.gather, "GatherND": xgather.onnx.gather_nd,
       "GatherElements": xgather.onnx.gather_elements}
GATHERS = tuple(OPS)
NEWEST = defs.onnx_opset_version()


# -- opset= is the model's opset_import ---------------------------------------------------

@pytest.mark.parametrize("op_type", GATHERS)
def test_op_version_matches_onnx_schema_table(op_type):
    for opset in range(0, NEWEST + 1):
        try:
            since = defs.get_schema(op_type, max_inclusive_version=opset).since_version
        except defs.SchemaError:
            with pytest.raises(XGatherError, match=rf"^onnx\.{op_type}: {op_type} exists from "
                                                   rf"opset \d+ on; got opset={opset}$"):
                xgather.onnx.op_version(op_type, opset)
            continue
        assert xgather.onnx.op_version(op_type, opset) == since, opset


def _ort_supports(opset: int) -> bool:
    try:
        ort_oracle.run("Gather", np.zeros(1, np.float32), np.zeros(1, np.int64), opset)
    except Exception:  # noqa: BLE001  (onnxruntime raises its own error types)
        return False
    return True


MODEL_OPSETS = [1, 10, 11, 12, 13, 17, 18, 21, 22, 23, 26]


@pytest.mark.parametrize("opset", MODEL_OPSETS)
def test_any_model_opset_vs_onnxruntime(opset, rng):
    data = rng.standard_normal((3, 4, 5)).astype(np.float32)
    take = rng.integers(-4, 4, (2, 3)).astype(np.int64)
    tuples = np.stack([rng.integers(-3, 3, (3, 2)), rng.integers(-4, 4, (3, 2))], -1)
    elems = rng.integers(-5, 5, (3, 4, 2)).astype(np.int64)
    cases = [("Gather", take, {"axis": 1}, lambda d, i: ref.gather(d, i, 1))]
    if opset >= 11:
        cases += [("GatherND", tuples, {}, ref.gather_nd),
                  ("GatherElements", elems, {"axis": 2},
                   lambda d, i: ref.gather_elements(d, i, 2))]
    if opset >= 12:
        nd_b = rng.integers(-4, 4, (3, 2, 1)).astype(np.int64)
        cases.append(("GatherND", nd_b, {"batch_dims": 1},
                      lambda d, i: ref.gather_nd(d, i, 1)))
    for op_type, idx, attrs, want in cases:
        got = OPS[op_type](data, idx, *attrs.values(), opset=opset)
        assert_same(got, want(data, idx))
        if _ort_supports(opset):
            assert_same(got, ort_oracle.run(op_type, data, idx, opset, **attrs))


def test_ort_covers_most_model_opsets():
    # The comparison above must not pass by onnxruntime skipping every opset.
    assert sum(map(_ort_supports, MODEL_OPSETS)) >= len(MODEL_OPSETS) - 2


def test_explain_shows_op_version_and_model_opset():
    data, idx = np.zeros((3, 4), np.float32), np.zeros(2, np.int64)
    plan = xgather.explain(xgather.onnx.gather, data, idx, axis=1, opset=21)
    assert plan.op == "onnx.Gather-13" and plan.model_opset == 21
    assert str(plan).startswith("onnx.Gather-13 (model opset 21): data(3, 4) indices(2,)")
    nd = xgather.explain(xgather.onnx.gather_nd, data, idx[:, None], opset=12)
    assert str(nd).startswith("onnx.GatherND-12 (model opset 12):")
    el = xgather.explain(xgather.onnx.gather_elements, data, idx[:, None], opset=12)
    assert str(el).startswith("onnx.GatherElements-11 (model opset 12):")
    at13 = xgather.explain(xgather.onnx.gather, data, idx, axis=1, opset=13)
    assert hash(plan) != hash(at13) and plan != at13  # frozen, hashable, and told apart
    with pytest.raises(AttributeError):
        plan.model_opset = 13


def test_errors_name_the_resolved_version():
    with pytest.raises(XGatherError, match=r"^onnx\.GatherND-11: batch_dims exists from opset 12 "
                                           r"on; got batch_dims=1"):
        xgather.onnx.gather_nd(np.zeros((2, 3)), np.zeros((2, 1), np.int64), 1, opset=11)
    with pytest.raises(OutOfBoundsError, match=r"^onnx\.Gather-13: index 3 at indices\[0\]"):
        xgather.onnx.gather(np.zeros(3), np.array([3]), opset=26)
    with pytest.raises(XGatherError, match=r"^onnx\.GatherElements: GatherElements exists from "
                                           r"opset 11 on; got opset=10"):
        xgather.onnx.gather_elements(np.zeros(3), np.zeros(3, np.int64), opset=10)


# -- from_node ----------------------------------------------------------------------------

def node(op_type, **attrs):
    return helper.make_node(op_type, ["data", "indices"], ["out"], **attrs)


NODE_CASES = [
    # id, node, model opset, data shape, indices maker, reference
    ("gather-default-axis", node("Gather"), 21, (4, 3),
     lambda g: g.integers(-4, 4, (2, 2)), lambda d, i: ref.gather(d, i, 0)),
    ("gather-axis-neg", node("Gather", axis=-1), 11, (2, 3, 5),
     lambda g: g.integers(-5, 5, (3,)), lambda d, i: ref.gather(d, i, 2)),
    ("gather-opset1", node("Gather", axis=1), 1, (2, 3),
     lambda g: g.integers(0, 3, (4,)), lambda d, i: ref.gather(d, i, 1)),
    ("gathernd-opset11", node("GatherND"), 11, (3, 4),
     lambda g: np.stack([g.integers(-3, 3, 5), g.integers(-4, 4, 5)], -1), ref.gather_nd),
    ("gathernd-batch", node("GatherND", batch_dims=1), 17, (2, 3, 4),
     lambda g: g.integers(-3, 3, (2, 5, 1)), lambda d, i: ref.gather_nd(d, i, 1)),
    ("gathernd-batch0-attr-at-12", node("GatherND", batch_dims=0), 12, (3, 4),
     lambda g: g.integers(-3, 3, (2, 1)), ref.gather_nd),
    ("elements-axis1", node("GatherElements", axis=1), 18, (3, 4),
     lambda g: g.integers(-4, 4, (3, 6)), lambda d, i: ref.gather_elements(d, i, 1)),
    ("elements-default-axis", node("GatherElements"), 11, (3, 2),
     lambda g: g.integers(-3, 3, (5, 2)), ref.gather_elements),
]


@pytest.mark.parametrize("nd, opset, shape, make, want",
                         [pytest.param(*c[1:], id=c[0]) for c in NODE_CASES])
def test_from_node_vs_reference_and_onnxruntime(nd, opset, shape, make, want, rng):
    data = rng.standard_normal(shape).astype(np.float32)
    idx = make(rng).astype(np.int64)
    f = xgather.onnx.from_node(nd, opset)
    check_everywhere(f, data, idx, want, tuples=nd.op_type == "GatherND")
    attrs = {a.name: helper.get_attribute_value(a) for a in nd.attribute}
    if _ort_supports(opset):
        assert_same(f(data, idx), ort_oracle.run(nd.op_type, data, idx, opset, **attrs))
    plan = xgather.explain(f, data, idx)
    assert plan.model_opset == opset
    assert plan.op == f"onnx.{nd.op_type}-{xgather.onnx.op_version(nd.op_type, opset)}"


def test_from_node_passes_options_through():
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    idx = np.array([-4, -1, 3, 7])
    gather = xgather.onnx.from_node(node("Gather", axis=1), 21, mode="fill", fill_value=-1.0)
    assert_same(gather(data, idx), ref.gather(data, idx, 1, oob="fill", fill=-1.0))
    clip = xgather.onnx.from_node(node("Gather", axis=1), 21, mode="clip")
    assert_same(clip(data, idx), ref.gather(data, idx, 1, oob="clip"))
    nonneg = xgather.onnx.from_node(node("GatherElements", axis=1), 13, mode="clip",
                                    negative_indices=False)
    el = np.array([[-1, 0], [2, 5]])
    assert_same(nonneg(data, el), ref.gather_elements(data, el, 1, negative=False, oob="clip"))
    with pytest.raises(OutOfBoundsError, match=r"^onnx\.Gather-13: index -4 at indices\[0\]"):
        xgather.onnx.from_node(node("Gather", axis=1), 21)(data, idx)


def test_from_node_under_grad():
    f = xgather.onnx.from_node(node("Gather"), 17)
    idx = np.array([0, 0, -1])
    g = jax.grad(lambda d: f(d, idx).sum())(np.ones(3, np.float32))
    assert_same(g, ref.scatter_add_take((3,), idx, np.ones(3, np.float32)))


def _twice(nd, name, value):
    """``nd`` with attribute ``name`` repeated (a NodeProto allows it; onnx.checker not)."""
    nd.attribute.extend([helper.make_attribute(name, value)])
    return nd


BAD_NODES = [
    ("unserved-op", node("Scatter"), 13, {},
     r"^xgather\.onnx\.from_node: op_type must be one of Gather, GatherND, GatherElements; "
     r"got 'Scatter'$"),
    ("other-domain", helper.make_node("Gather", ["d", "i"], ["o"], domain="com.microsoft"), 13,
     {}, r"^onnx\.Gather: from_node serves the default ONNX domain \('' or 'ai\.onnx'\); "
     r"got 'com\.microsoft'$"),
    ("gathernd-before-11", node("GatherND"), 10, {},
     r"^onnx\.GatherND: GatherND exists from opset 11 on; got opset=10$"),
    ("elements-before-11", node("GatherElements"), 9, {},
     r"^onnx\.GatherElements: GatherElements exists from opset 11 on; got opset=9$"),
    ("gather-before-1", node("Gather"), 0, {},
     r"^onnx\.Gather: Gather exists from opset 1 on; got opset=0$"),
    ("batch-dims-at-11", node("GatherND", batch_dims=0), 11, {},
     r"^onnx\.GatherND-11: attribute batch_dims exists from opset 12 on; "
     r"got batch_dims at model opset 11$"),
    ("unknown-attribute", node("Gather", axes=1), 13, {},
     r"^onnx\.Gather-13: unknown attribute; Gather takes only axis; got 'axes'$"),
    ("batch-dims-on-gather", node("Gather", batch_dims=1), 21, {},
     r"^onnx\.Gather-13: unknown attribute; Gather takes only axis; got 'batch_dims'$"),
    ("float-axis", node("Gather", axis=1.0), 13, {},
     r"^onnx\.Gather-13: attribute axis must be an int; got FLOAT$"),
    ("three-inputs", helper.make_node("Gather", ["d", "i", "x"], ["o"]), 13, {},
     r"^onnx\.Gather-13: Gather takes 2 inputs and gives 1 output; got 3 inputs and 1 outputs$"),
    ("unknown-option", node("Gather"), 13, {"modes": "clip"},
     r"^onnx\.Gather-13: options must be among mode, fill_value, indices_are_sorted, "
     r"unique_indices, negative_indices; got 'modes'$"),
    ("bad-mode", node("Gather"), 13, {"mode": "wrap"},
     r"^onnx\.Gather-13: mode must be one of 'error', 'clip', 'fill', 'promise_in_bounds'; "
     r"got 'wrap'$"),
    ("opset-not-int", node("Gather"), "21", {},
     r"^onnx\.Gather: opset must be an int \(the model's opset_import version\); got '21'$"),
    ("not-a-node", "Gather", 13, {},
     r"^xgather\.onnx\.from_node: node must be an onnx\.NodeProto; got str$"),
    ("axis-twice", _twice(node("Gather", axis=1), "axis", 0), 13, {},
     r"^onnx\.Gather-13: each attribute may appear once; got axis 2 times$"),
]


@pytest.mark.parametrize("nd, opset, options, pattern",
                         [pytest.param(*b[1:], id=b[0]) for b in BAD_NODES])
def test_from_node_errors(nd, opset, options, pattern):
    with pytest.raises(XGatherError, match=pattern):
        xgather.onnx.from_node(nd, opset, **options)


# -- reference_ops: onnx.reference.ReferenceEvaluator running gathers through xgather ------

def _node_cases():
    """onnx's backend node test cases whose graphs hold a gather, built in memory.

    onnx 1.23 ships no node-test files; importing a module of
    ``onnx.backend.test.case.node`` runs its ``export*`` methods, which add
    cases (model, inputs, expected outputs) to one list.
    """
    package = importlib.import_module("onnx.backend.test.case.node")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # onnx's own casts in building the cases
        for name in ("gather", "gathernd", "gatherelements", "negativeloglikelihoodloss",
                     "rotaryembedding", "attention", "affinegrid", "center_crop_pad"):
            importlib.import_module(f"{package.__name__}.{name}")
    wanted = ("test_gather", "test_nllloss", "test_rotary_embedding", "test_attention",
              "test_affine_grid", "test_center_crop_pad")
    cases = {}
    for case in package._NodeTestCases:
        if case.name.startswith(wanted) and _gather_nodes(case.model.graph) and (
                case.name.startswith("test_gather") or case.name.endswith("_expanded")):
            cases[case.name] = case
    return cases


def _gather_nodes(graph, subgraphs: bool = True) -> int:
    """The gather nodes of ``graph`` (and of its subgraphs: If branches, Loop bodies)."""
    count = 0
    for nd in graph.node:
        count += nd.op_type in GATHERS and nd.domain in ("", "ai.onnx")
        for a in nd.attribute if subgraphs else ():
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                count += _gather_nodes(g)
    return count


NODE_TESTS = _node_cases()
FAMILIES = ("test_gather", "test_nllloss", "test_rotary_embedding", "test_attention",
            "test_affine_grid", "test_center_crop_pad")


def test_every_family_of_node_tests_is_there():
    for family in FAMILIES:
        assert any(n.startswith(family) for n in NODE_TESTS), family
    assert len(NODE_TESTS) >= 70, sorted(NODE_TESTS)


@pytest.fixture
def counted(monkeypatch):
    """Count the calls of the three xgather.onnx ops (and the model opsets they get)."""
    calls = []
    for op_type, fn in OPS.items():
        def counting(*args, _fn=fn, _op=op_type, **kwargs):
            calls.append((_op, kwargs.get("opset")))
            return _fn(*args, **kwargs)
        monkeypatch.setattr(xgather.onnx._ops, fn.__name__, counting)
    return calls


def _feeds(model, inputs):
    names = [i.name for i in model.graph.input
             if i.name not in {t.name for t in model.graph.initializer}]
    return dict(zip(names, inputs, strict=True))


def _onnxruntime(model, feeds):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        sess = ort.InferenceSession(model.SerializeToString(), options,
                                    providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001  (onnxruntime has no kernel for some bf16 ops)
        return None
    return sess.run(None, feeds)


def _close(got, want, rtol, atol):
    assert got.shape == want.shape and got.dtype == want.dtype, (got.dtype, want.dtype)
    if want.dtype.kind in "fc" or want.dtype.name == "bfloat16":
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                   rtol=rtol, atol=atol)
    else:
        np.testing.assert_array_equal(got, want)


def _opset(model) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


@pytest.mark.parametrize("name", sorted(NODE_TESTS))
def test_reference_ops_on_onnx_node_tests(name, counted):
    case = NODE_TESTS[name]
    (inputs, outputs), = case.data_sets
    feeds = _feeds(case.model, inputs)
    with warnings.catch_warnings():
        # onnx's NumPy kernels (Softmax over -inf rows in the NaN-robustness cases)
        warnings.filterwarnings("ignore", "invalid value encountered", RuntimeWarning)
        got = ReferenceEvaluator(case.model, new_ops=xgather.onnx.reference_ops()).run(
            None, feeds)
    # xgather ran every gather of the main graph, and those of the If branches taken
    # (the 3-D affine_grid cases hold their only GatherElements in the 2-D branch).
    top, every = _gather_nodes(case.model.graph, False), _gather_nodes(case.model.graph)
    assert top <= len(counted) <= every
    assert counted or (top == 0 and name.startswith("test_affine_grid_3d")), name
    assert {opset for _, opset in counted} <= {_opset(case.model)}
    for g, w in zip(got, outputs, strict=True):
        _close(g, w, case.rtol, case.atol)
    theirs = _onnxruntime(case.model, feeds)
    if theirs is None:
        assert "bf16" in name, "onnxruntime should run every case but the bfloat16 ones"
        return
    for g, o in zip(got, theirs, strict=True):
        _close(g, o, max(case.rtol, 1e-5), max(case.atol, 1e-6))


def _model(op_type, dtype, opset=13, idx_dtype=np.int64, **attrs):
    def info(name, dt):
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(
            np.dtype(dt)), None)
    graph = helper.make_graph([node(op_type, **attrs)], "g",
                              [info("data", dtype), info("indices", idx_dtype)],
                              [info("out", dtype)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


WIDE = [
    ("int64", np.array([[2**62 + 1, -(2**63)], [7, 2**40 + 3]], np.int64)),
    ("uint64", np.array([[2**64 - 1, 1], [2**63 + 5, 0]], np.uint64)),
    ("float64", np.array([[1 / 3, np.pi], [1e300, -5e-324]])),
    ("int32", np.array([[2**31 - 1, -5], [3, 4]], np.int32)),
    ("bool", np.array([[True, False], [False, True]])),
    ("float16", np.array([[1.5, -0.0], [np.inf, 65504]], np.float16)),
    ("str", np.array([["a", "bc"], ["", "def"]], dtype=object)),
]


@pytest.mark.parametrize("dtype, data", WIDE, ids=[w[0] for w in WIDE])
def test_reference_ops_keep_every_dtype_exact(dtype, data, counted):
    idx = np.array([[1, -2], [0, 1]], np.int64)
    model = _model("Gather", data.dtype, 21, axis=1)
    (got,) = ReferenceEvaluator(model, new_ops=xgather.onnx.reference_ops()).run(
        None, {"data": data, "indices": idx})
    assert isinstance(got, np.ndarray) and counted == [("Gather", 21)]
    want = ref.gather(data, idx, 1)
    assert got.dtype == want.dtype and got.shape == want.shape
    if dtype == "str":
        assert got.tolist() == want.tolist()
        return
    assert got.tobytes() == want.tobytes()  # bit for bit: -0.0, subnormals, 64-bit ints
    assert_same(got, _onnxruntime(model, {"data": data, "indices": idx})[0])


@pytest.mark.parametrize("op_type, attrs, idx", [
    ("Gather", {"axis": 0}, np.array([0, 3])),
    ("GatherND", {}, np.array([[0, -4]])),
    ("GatherElements", {"axis": 1}, np.array([[0, 1, 2], [5, 0, 0]])),
])
def test_reference_ops_raise_out_of_range(op_type, attrs, idx):
    data = np.zeros((2, 3), np.float32)
    model = _model(op_type, np.float32, 13, **attrs)
    feeds = {"data": data, "indices": idx.astype(np.int64)}
    with pytest.raises(OutOfBoundsError, match=rf"^onnx\.{op_type}-13: index"):
        ReferenceEvaluator(model, new_ops=xgather.onnx.reference_ops()).run(None, feeds)
    with pytest.raises(Exception, match=r"(?i)out of (data )?(bounds|range)|invalid index"):
        _onnxruntime(model, feeds)  # onnxruntime rejects them too


def test_reference_ops_raise_xgather_type_errors_with_their_message():
    """onnx's OpRun.run rewraps TypeErrors; xgather's own errors come through as raised."""
    model = _model("Gather", np.float32, 13, axis=0)
    feeds = {"data": np.zeros((2, 3), np.float32), "indices": np.array([0.5])}
    with pytest.raises(XGatherTypeError, match=r"^onnx\.Gather-13: indices must be int32 or "
                                               r"int64; got float64"):
        ReferenceEvaluator(model, new_ops=xgather.onnx.reference_ops()).run(None, feeds)
    feeds["indices"] = np.array([7])
    sess = ReferenceEvaluator(model, new_ops=xgather.onnx.reference_ops(mode="fill",
                                                                        fill_value="x"))
    with pytest.raises(XGatherTypeError, match=r"^onnx\.Gather-13: fill_value for float32 data "
                                               r"must be a number; got 'x'"):
        sess.run(None, feeds)


def test_reference_ops_take_options():
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    idx = np.array([[0, 1, 2], [5, -1, -7]], np.int64)
    model = _model("GatherElements", np.float32, 13, axis=1)
    sess = ReferenceEvaluator(model, new_ops=xgather.onnx.reference_ops(mode="fill",
                                                                        fill_value=9.0))
    (got,) = sess.run(None, {"data": data, "indices": idx})
    assert_same(got, ref.gather_elements(data, idx, 1, oob="fill", fill=9.0))
    with pytest.raises(XGatherError, match=r"^xgather\.onnx\.reference_ops: options must be"):
        xgather.onnx.reference_ops(axis=1)
    with pytest.raises(XGatherError, match=r"^xgather\.onnx\.reference_ops: mode must be one"):
        xgather.onnx.reference_ops(mode="wrap")


def test_reference_ops_resolve_the_model_opset(counted):
    data = np.arange(12, dtype=np.float32).reshape(2, 6)
    idx = np.array([[4], [-1]], np.int64)
    feeds = {"data": data, "indices": idx}
    for opset in (12, 13, 21):
        model = _model("GatherND", np.float32, opset, batch_dims=1)
        (got,) = ReferenceEvaluator(model, new_ops=xgather.onnx.reference_ops()).run(None, feeds)
        assert_same(got, ref.gather_nd(data, idx, 1))
    assert counted == [("GatherND", 12), ("GatherND", 13), ("GatherND", 21)]
    with pytest.raises(XGatherError, match=r"^onnx\.GatherND-11: attribute batch_dims exists "
                                           r"from opset 12 on"):
        ReferenceEvaluator(_model("GatherND", np.float32, 11, batch_dims=1),
                           new_ops=xgather.onnx.reference_ops()).run(None, feeds)


def test_reference_ops_inside_subgraphs(counted):
    # A Gather in both branches of an If: the evaluator hands new_ops down to subgraphs.
    def branch(axis):
        return helper.make_graph(
            [helper.make_node("Gather", ["data", "indices"], ["y"], axis=axis)], f"b{axis}", [],
            [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["out"], then_branch=branch(0), else_branch=branch(1))],
        "g", [helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, []),
              helper.make_tensor_value_info("data", onnx.TensorProto.FLOAT, None),
              helper.make_tensor_value_info("indices", onnx.TensorProto.INT64, None)],
        [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    data, idx = np.arange(4, dtype=np.float32).reshape(2, 2), np.array([-1], np.int64)
    sess = ReferenceEvaluator(model, new_ops=xgather.onnx.reference_ops())
    for cond, axis in ((True, 0), (False, 1)):
        feeds = {"cond": np.array(cond), "data": data, "indices": idx}
        (got,) = sess.run(None, feeds)
        assert_same(got, ref.gather(data, idx, axis))
        assert_same(got, _onnxruntime(model, feeds)[0])
    assert counted == [("Gather", 18), ("Gather", 18)]


@pytest.mark.subprocess
@pytest.mark.skipif(X64, reason="already the x64 run")
def test_reference_ops_with_x64_on():
    rerun_with_x64(__file__, "reference_ops and not x64_on")


# -- conformance edges ----------------------------------------------------------------------

NOT_ARRAYS = [("none", None), ("string", "abc"), ("object", object()), ("dict", {"a": 1}),
              ("set", {1, 2})]


@pytest.mark.parametrize("fn, op", [
    (lambda d, i: xgather.onnx.gather(d, i), "onnx.Gather-13"),
    (lambda d, i: xgather.onnx.gather_nd(d, i), "onnx.GatherND-13"),
    (lambda d, i: xgather.onnx.gather_elements(d, i), "onnx.GatherElements-13"),
    (lambda d, i: xgather.openvino.gather(d, i, 0), "openvino.Gather-8"),
    (lambda d, i: xgather.bnns.gather_nd(d, i), "bnns.GatherND"),
    (lambda d, i: xgather.labview.gather(d, i), "labview.Gather"),
], ids=["onnx-gather", "onnx-gathernd", "onnx-elements", "openvino", "bnns", "labview"])
@pytest.mark.parametrize("which", ["data", "indices"])
@pytest.mark.parametrize("value", [v for _, v in NOT_ARRAYS], ids=[k for k, _ in NOT_ARRAYS])
def test_non_array_inputs_are_named(fn, op, which, value):
    good = {"data": np.zeros((2, 2), np.float32), "indices": np.zeros((2, 2), np.int64)}
    good[which] = value
    kind = type(value).__name__
    with pytest.raises(XGatherError, match=rf"^{op}.*: {which} must be an array \(or a nested "
                                           rf"list or scalar of numbers\); got {kind}$"):
        fn(good["data"], good["indices"])


def test_lists_and_scalars_are_still_arrays():
    assert_same(xgather.onnx.gather([[1.5, 2.5]], 0, axis=1), np.array([1.5], np.float32))
    assert_same(xgather.onnx.gather((3, 4, 5), [-1]), np.array([5], np.int32))


@pytest.mark.skipif(X64, reason="checks the x64-off rule")
@pytest.mark.parametrize("fn", [
    lambda d: xgather.onnx.gather(d, np.array([0, -1])),
    lambda d: xgather.onnx.gather(d, np.array([0]), mode="promise_in_bounds"),
    lambda d: xgather.openvino.gather(d, np.array([5], np.int8), 0),
    lambda d: xgather.onnx.gather_nd(d, np.array([[1]]), mode="fill"),
], ids=["onnx-error", "onnx-promise", "openvino", "gathernd-fill"])
def test_axis_beyond_int32_without_x64_is_an_xgather_error(fn):
    # eval_shape traces with abstract data: nothing of 2 GiB is allocated.
    big = jax.ShapeDtypeStruct((2**31,), np.int8)
    with pytest.raises(XGatherError, match=r"with jax_enable_x64 off, indices are int32 and "
                                           r"cannot address an axis of 2\*\*31 or more elements "
                                           r".*; got axis sizes \(2147483648,\)"):
        jax.eval_shape(fn, big)
    # One short of 2**31 is addressable.
    out = jax.eval_shape(fn, jax.ShapeDtypeStruct((2**31 - 1,), np.int8))
    assert out.dtype == np.int8


# -- a real model: silero-vad (its package pulls torch, so it is not a test dependency) -----

def _silero_source():
    source = os.environ.get("XGATHER_SILERO_VAD")  # a silero-vad wheel, folder or .onnx file
    if source is None and importlib.util.find_spec("silero_vad") is None:
        pytest.skip("silero-vad models not at hand: set XGATHER_SILERO_VAD to the wheel from "
                    "`pip download --no-deps silero-vad` (the package itself pulls torch)")
    return source


def test_silero_vad_model_vs_onnxruntime():
    spec = importlib.util.spec_from_file_location(
        "silero_vad_example", os.path.join(os.path.dirname(os.path.dirname(__file__)),
                                           "examples", "silero_vad.py"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    models = example.load_models(_silero_source())
    model = models["silero_vad_op18_ifless.onnx"]  # opset 18, Gather nodes inside an If
    assert example.gather_nodes(onnx.load_from_string(model).graph)["Gather"] >= 1
    report = example.compare(model, chunks=2)
    assert report["gather_calls"].get("gather", 0) >= 2, report
    assert report["max_abs_diff"] < 1e-4, report


def test_a_named_nodes_errors_name_it_eagerly_under_checked_and_in_the_evaluator():
    """As onnxruntime names the node that failed ("...running Gather node.
    Name:'emb'..."): the node's name follows the op in every error."""
    node = helper.make_node("Gather", ["x", "i"], ["y"], axis=0, name="emb")
    f = xgather.onnx.from_node(node, opset=13)
    data = np.arange(6, dtype=np.float32).reshape(3, 2)
    with pytest.raises(OutOfBoundsError, match=r"^onnx\.Gather-13 \(node 'emb'\): index 5 "
                                               r"at indices\[1\] is out of range \[-3, 2\]"):
        f(data, np.array([0, 5]))
    with pytest.raises(XGatherTypeError, match=r"^onnx\.Gather-13 \(node 'emb'\): indices "):
        f(data, np.array([0.5]))
    g = xgather.checked(f)
    g(data, np.array([1, -4]))
    with pytest.raises(OutOfBoundsError, match=r"^onnx\.Gather-13 \(node 'emb'\): index -4 "
                                               r"at indices\[1\]") as info:
        xgather.raise_if_error()
    assert info.value.node == "emb" and info.value.file == __file__
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 2]),
                      helper.make_tensor_value_info("i", onnx.TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    evaluator = ReferenceEvaluator(model, new_ops=xgather.onnx.reference_ops())
    with pytest.raises(OutOfBoundsError, match=r"^onnx\.Gather-13 \(node 'emb'\): index 3"):
        evaluator.run(None, {"x": data, "i": np.array([3, 0])})
    unnamed = xgather.onnx.from_node(helper.make_node("Gather", ["x", "i"], ["y"]), opset=13)
    with pytest.raises(OutOfBoundsError, match=r"^onnx\.Gather-13: index 3"):
        unnamed(data, np.array([3]))
