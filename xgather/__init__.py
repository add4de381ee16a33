"""xgather: the gather operators of ONNX, OpenVINO, BNNS and LabVIEW, exactly, in JAX."""

from xgather import bnns, labview, onnx, openvino, sharded
from xgather._checked import (
    MAX_PENDING,
    READ_GROUP,
    checked,
    clear_caches,
    raise_if_error,
    sync_checks,
)
from xgather._errors import OutOfBoundsError, UncheckedWarning, XGatherError, XGatherTypeError
from xgather._frontend import explain
from xgather._lower import lowering
from xgather._modes import MODES, default_mode, set_default_mode
from xgather._plan import Plan

__version__ = "0.1.0"


def __getattr__(name: str):
    # xgather.export on first use: it needs jax2onnx only when it exports, and importing
    # it costs every user of xgather a few more JAX modules.
    if name == "export":
        import importlib
        return importlib.import_module("xgather.export")
    raise AttributeError(f"module 'xgather' has no attribute {name!r}")


__all__ = [
    "MAX_PENDING",
    "MODES",
    "OutOfBoundsError",
    "Plan",
    "READ_GROUP",
    "UncheckedWarning",
    "XGatherError",
    "XGatherTypeError",
    "checked",
    "clear_caches",
    "default_mode",
    "explain",
    "export",
    "bnns",
    "labview",
    "lowering",
    "onnx",
    "openvino",
    "raise_if_error",
    "set_default_mode",
    "sharded",
    "sync_checks",
]
