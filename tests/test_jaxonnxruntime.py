"""jaxonnxruntime running gather nodes through xgather, against onnxruntime and NumPy loops."""

from __future__ import annotations

import contextlib
from unittest import mock

import numpy as np
import pytest

pytest.importorskip("jaxonnxruntime",
                    reason="jaxonnxruntime not installed (xgather[jaxonnxruntime])")
pytest.importorskip("absl", reason="jaxonnxruntime imports absl-py")
from jaxonnxruntime import backend as jort  # noqa: E402
from jaxonnxruntime import call_onnx  # noqa: E402
from jaxonnxruntime.core import handler  # noqa: E402
from onnx import helper  # noqa: E402

import xgather  # noqa: E402
from tests import ort_oracle, reference  # noqa: E402
from tests.helpers import GATHER_NODE_TESTS, gather_node_test_case  # noqa: E402

# --- registered ------------------------------------------------------------------------------

HANDLERS = xgather.onnx.register_jaxonnxruntime()


def test_registration_is_idempotent_and_kept():
    again = xgather.onnx.register_jaxonnxruntime()
    assert again == HANDLERS
    live = handler.Handler.__subclasses__()
    assert all(cls in live for cls in HANDLERS.values())


@pytest.mark.parametrize("opset", [1, 11, 12, 13, 17, 21])
def test_handlers_chosen_at_every_opset(opset):
    handlers = call_onnx._get_all_handlers([helper.make_opsetid("", opset)])[""]
    for op_type, cls in HANDLERS.items():
        if op_type == "Gather" or opset >= 11:
            assert handlers[op_type] is cls, (op_type, opset)


@contextlib.contextmanager
def _through_xgather():
    """The op types of the nodes that xgather's handlers ran in the block (jaxonnxruntime
    runs each node twice: once as it builds the model function, once in it).

    jaxonnxruntime has Gather and GatherElements handlers of its own: a right answer alone
    does not show that xgather ran the node. Each of xgather's handler classes is wrapped
    for the block; the function its ``handle`` gives is recorded when jaxonnxruntime
    calls it."""
    calls: list[str] = []

    def spy(op_type, handle):
        def wrapped(cls, node, inputs, **kwargs):
            run = handle(node, inputs, **kwargs)

            def recorded(*args, **kw):
                calls.append(op_type)
                return run(*args, **kw)
            return recorded
        return classmethod(wrapped)

    with contextlib.ExitStack() as stack:
        for op_type, cls in HANDLERS.items():
            stack.enter_context(mock.patch.object(cls, "handle", spy(op_type, cls.handle)))
        yield calls


def _model(op, opset, data, indices, **attrs):
    node = helper.make_node(op, ["data", "indices"], ["out"], **attrs)
    dtype = helper.np_dtype_to_tensor_dtype
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("data", dtype(data.dtype), data.shape),
         helper.make_tensor_value_info("indices", dtype(indices.dtype), indices.shape)],
        [helper.make_tensor_value_info("out", dtype(data.dtype), None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


DATA = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
CASES = {  # id: (op, indices, attrs, NumPy reference, opsets)
    "gather-axis1-negative": ("Gather", np.array([[0, -1], [2, -3]]), {"axis": 1},
                              lambda d, i: reference.gather(d, i, 1), (11, 13, 17, 21)),
    "gather-axis-last": ("Gather", np.array([3, 0, -4]), {"axis": -1},
                         lambda d, i: reference.gather(d, i, -1), (13, 21)),
    "gathernd": ("GatherND", np.array([[0, -1], [1, 2]]), {},
                 lambda d, i: reference.gather_nd(d, i), (11, 12, 13, 21)),
    "gathernd-batch_dims1": ("GatherND", np.array([[[2, -1]], [[0, 0]]]), {"batch_dims": 1},
                             lambda d, i: reference.gather_nd(d, i, 1), (12, 13, 21)),
    "gatherelements-axis2": ("GatherElements", np.array([[[0, -1, 3]] * 3] * 2), {"axis": 2},
                             lambda d, i: reference.gather_elements(d, i, 2), (11, 13, 21)),
}


@pytest.mark.parametrize("opset_case", [(c, o) for c, v in CASES.items() for o in v[4]],
                         ids=lambda oc: f"{oc[0]}-opset{oc[1]}")
def test_node_against_onnxruntime_and_numpy(opset_case):
    case, opset = opset_case
    op, indices, attrs, ref, _ = CASES[case]
    with _through_xgather() as calls:
        got = np.asarray(jort.run(_model(op, opset, DATA, indices, **attrs),
                                  [DATA, indices])[0])
    assert set(calls) == {op}, calls
    want = ref(DATA, indices)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, ort_oracle.run(op, DATA, indices, opset, **attrs))


@pytest.mark.parametrize("op, indices, attrs", [
    ("Gather", np.array([0, 3]), {"axis": 1}),
    ("GatherND", np.array([[0, 3]]), {}),
    ("GatherElements", np.array([[[0, 0, 4]] * 3] * 2), {"axis": 2}),
    ("GatherElements", np.array([[[0, 0, -5]] * 3] * 2), {"axis": 2}),
])
def test_out_of_range_index_raises(op, indices, attrs):
    with pytest.raises(xgather.OutOfBoundsError,
                       match=rf"onnx\.{op}-13 \(node 'node_0'\): index -?\d"):
        jort.run(_model(op, 21, DATA, indices, **attrs), [DATA, indices])


def test_gathernd_batch_dims_before_opset_12_is_an_error():
    indices = np.array([[[2, -1]], [[0, 0]]])
    with pytest.raises(xgather.XGatherError, match="batch_dims exists from opset 12"):
        jort.run(_model("GatherND", 11, DATA, indices, batch_dims=1), [DATA, indices])


# --- ONNX's own node tests, built in memory, through jaxonnxruntime's backend ---------------

class _CheckedRep:
    """A prepared model whose every run must take xgather's handler for each gather node."""

    def __init__(self, rep, gathers):
        self.rep, self.gathers = rep, gathers

    def run(self, inputs, **kwargs):
        with _through_xgather() as calls:
            out = self.rep.run(inputs, **kwargs)
        assert self.gathers and set(calls) == self.gathers, (calls, self.gathers)
        return out


class _ThroughXGather(jort.Backend):
    """jaxonnxruntime's backend, checking that xgather, not jaxonnxruntime's own handlers,
    ran each gather node of ONNX's node tests."""

    @classmethod
    def prepare(cls, model, device="CPU", **kwargs):
        gathers = {n.op_type for n in model.graph.node if n.op_type in HANDLERS}
        return _CheckedRep(super().prepare(model, device, **kwargs), gathers)


OnnxBackendNodeModelTest = gather_node_test_case(_ThroughXGather, __name__)


def test_all_ten_gather_node_tests_are_collected():
    found = {n.removesuffix("_cpu") for n in vars(OnnxBackendNodeModelTest)
             if n.startswith("test_")}
    assert found == GATHER_NODE_TESTS


def test_readme_jaxonnxruntime_example_runs():
    from tests.test_docs import BLOCKS

    block = next(b for b in BLOCKS if "register_jaxonnxruntime" in b)
    ns: dict = {}
    exec(compile(block, "README-jaxonnxruntime", "exec"), ns)
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(ns["out"][0], reference.gather_nd(data, [[2], [-3]], 1))


def test_an_out_of_range_index_names_its_node_as_jaxonnxruntime_names_it():
    """jaxonnxruntime names every node ``node_<its index in the graph>``, whatever the
    model called it: the error names the node by that name."""
    model = _model("Gather", 13, DATA, np.array([0, 3]), axis=1)
    model.graph.node[0].name = "token_lookup"
    with pytest.raises(xgather.OutOfBoundsError,
                       match=r"onnx\.Gather-13 \(node 'node_0'\): index 3") as info:
        jort.run(model, [DATA, np.array([0, 3])])
    assert info.value.node == "node_0" and info.value.index == 3
