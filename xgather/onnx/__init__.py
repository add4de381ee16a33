"""ONNX ``Gather`` (opsets 1, 11, 13), ``GatherND`` (11, 12, 13), ``GatherElements`` (11, 13),
and ONNX models in: node adapters, ``onnx.reference`` ops, jaxonnxruntime handlers.

The ops and their version table are in ``xgather.onnx._ops``, the model adapters in
``xgather.onnx._models``; this package hands their public names on.
"""

from xgather.onnx._models import from_node, reference_ops, register_jaxonnxruntime
from xgather.onnx._ops import (
    INDEX_DTYPES,
    VERSIONS,
    gather,
    gather_elements,
    gather_nd,
    op_version,
)

__all__ = ["INDEX_DTYPES", "VERSIONS", "from_node", "gather", "gather_elements", "gather_nd",
           "op_version", "reference_ops", "register_jaxonnxruntime"]
