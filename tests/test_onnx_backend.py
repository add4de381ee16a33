"""ONNX's own backend test runner, driving the gather node tests through xgather."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.backend.base
import onnx.backend.test
from onnx import numpy_helper

import xgather
from tests.helpers import GATHER_NODE_TESTS, gather_node_test_case

_OPS = {"Gather": xgather.onnx.gather, "GatherND": xgather.onnx.gather_nd,
        "GatherElements": xgather.onnx.gather_elements}


def _opset(model) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


class XGatherRep(onnx.backend.base.BackendRep):
    def __init__(self, model):
        self.graph = model.graph
        self.opset = _opset(model)

    def run(self, inputs, **kwargs):
        env = {init.name: numpy_helper.to_array(init) for init in self.graph.initializer}
        names = [i.name for i in self.graph.input if i.name not in env]
        env.update(zip(names, inputs, strict=False))
        for node in self.graph.node:
            fn = _OPS.get(node.op_type)
            if fn is None:
                raise NotImplementedError(f"xgather runs only gather nodes; got {node.op_type}")
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            # The newest opset each op has, not above the model's.
            versions = {"Gather": (1, 11, 13), "GatherND": (11, 12, 13),
                        "GatherElements": (11, 13)}[node.op_type]
            opset = max(v for v in versions if v <= self.opset)
            env[node.output[0]] = np.asarray(fn(*(env[n] for n in node.input), **attrs,
                                                opset=opset))
        return tuple(env[o.name] for o in self.graph.output)


class XGatherBackend(onnx.backend.base.Backend):
    @classmethod
    def prepare(cls, model, device="CPU", **kwargs):
        super().prepare(model, device, **kwargs)
        return XGatherRep(model)

    @classmethod
    def supports_device(cls, device):
        return device == "CPU"


OnnxBackendNodeModelTest = gather_node_test_case(XGatherBackend, __name__)


def test_all_ten_gather_node_tests_are_collected():
    found = {n.removesuffix("_cpu") for n in vars(OnnxBackendNodeModelTest)
             if n.startswith("test_")}
    assert found == GATHER_NODE_TESTS
