"""ONNX's own backend test runner, driving the gather node tests through xgather."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnx.backend.base
import onnx.backend.test
from onnx import numpy_helper

import xgather

GATHER_NODE_TESTS = {
    "test_gather_0", "test_gather_1", "test_gather_2d_indices", "test_gather_negative_indices",
    "test_gather_elements_0", "test_gather_elements_1", "test_gather_elements_negative_indices",
    "test_gathernd_example_float32", "test_gathernd_example_int32",
    "test_gathernd_example_int32_batch_dim1",
}

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


# onnx builds every node case at import; its own casts warn (not ours to fix).
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    backend_test = onnx.backend.test.BackendTest(XGatherBackend, __name__)
for name in sorted(GATHER_NODE_TESTS):
    backend_test.include(rf"^{name}_cpu$")
# Keep only the included cases (the runner would report thousands of skips).
OnnxBackendNodeModelTest = backend_test.test_cases["OnnxBackendNodeModelTest"]
for _name in [n for n in vars(OnnxBackendNodeModelTest) if n.startswith("test_")]:
    if _name.removesuffix("_cpu") not in GATHER_NODE_TESTS or not _name.endswith("_cpu"):
        delattr(OnnxBackendNodeModelTest, _name)


def test_all_ten_gather_node_tests_are_collected():
    found = {n.removesuffix("_cpu") for n in vars(OnnxBackendNodeModelTest)
             if n.startswith("test_")}
    assert found == GATHER_NODE_TESTS
