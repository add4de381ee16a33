"""Export with jax2onnx, run in onnxruntime, compare with NumPy loops and with eager xgather."""

from __future__ import annotations

import functools
import logging

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

# jax2onnx logs a warning for each of its plugin trees whose framework is absent.
logging.getLogger("jax2onnx").setLevel(logging.ERROR)


rng = np.random.default_rng(0)
DATA = rng.normal(size=(2, 3, 4)).astype(np.float32)
OPSETS = (17, 21)


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
                           "error", True, None),
    "openvino.gather_elements": (lambda: functools.partial(xgather.openvino.gather_elements,
                                                           axis=1),
                                 _ref(reference.gather_elements, axis=1),
                                 _i(rng.integers(-5, 5, size=(2, 3, 4))),
                                 _i(rng.integers(-3, 3, size=(2, 3, 4))), "error", True, None),
    "bnns.gather_nd": (lambda: xgather.bnns.gather_nd, _ref(reference.gather_nd),
                       _i([[0, 1], [-1, 1], [1, 3]]), _i([[0, 1], [1, 2]]), "error", False,
                       None),
    "bnns.gather": (lambda: functools.partial(xgather.bnns.gather, axis=1),
                    _ref(reference.gather, axis=1), _i([[0, -1, 5], [2, 1, 3]]),
                    _i([[0, 1, 2]]), "error", False, None),
    "bnns.gather_along_axis": (lambda: functools.partial(xgather.bnns.gather_along_axis, axis=2),
                               _ref(reference.gather_elements, axis=2),
                               _i(rng.integers(-5, 6, size=(2, 3, 4))),
                               _i(rng.integers(0, 4, size=(2, 3, 4))), "error", False, None),
    "labview.gather": (lambda: functools.partial(xgather.labview.gather, axis=1),
                       _ref(reference.gather, axis=1), _i([[0, -1, 5]]), _i([[0, -1, 2]]),
                       "error", True, None),
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
    if which == "default" and OPS[op_id][4] == "error" and node is None:
        with pytest.raises(xgather.XGatherError, match='mode="error" cannot be exported'):
            _export(fn, (DATA, indices), opset)
        return
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


@pytest.mark.parametrize("op_id", ["onnx.gather", "onnx.gather_nd", "onnx.gather_elements"])
def test_exported_onnx_node_rejects_out_of_range(op_id):
    fn, _, _, _ = _case(op_id, None, True, "default")
    model = _export(fn, (DATA, OPS[op_id][3]), 21)
    with pytest.raises(Exception, match="(?i)out of (range|bounds)|invalid index|indices"):
        _ort(model, (DATA, OPS[op_id][2]))


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


def test_error_mode_names_the_remedy():
    fn = functools.partial(xgather.onnx.gather, axis=1, negative_indices=False)
    with pytest.raises(xgather.XGatherError, match="negative_indices=True exports as the ONNX"):
        _export(fn, (DATA, _i([0])), 21)


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
    assert xgather._apply.compiled.cache_info().currsize > 0
    _export(fn, (DATA, indices), 21)
    assert xgather._apply.compiled.cache_info().currsize == 0
    np.testing.assert_array_equal(fn(DATA, indices),
                                  reference.gather(DATA, indices, 1, negative=False))


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
    from tests.test_readme import BLOCKS

    block = next(b for b in BLOCKS if "xgather.export.to_onnx" in b)
    ns: dict = {}
    exec(compile(block, "README-export", "exec"), ns)
    assert [n.op_type for n in ns["model"].graph.node] == ["Gather"]
    np.testing.assert_array_equal(ns["out"], reference.gather(ns["table"], ns["ids"], 0))
