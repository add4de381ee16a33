"""OpenVINO ``Gather`` (opset 1, 7, 8), ``GatherND`` (5, 8), ``GatherElements`` (6).

Choices, with the evidence behind them:

* Gather: ``axis`` is an input in OpenVINO. Here it is a Python int, or a
  scalar / 1-element array whose value is known when tracing; a traced axis is
  an error (the output shape depends on it).
* Gather-8 specifies that negative indices count from the end and that an
  index outside ``[-s, s-1]`` yields zeros: that is ``mode=None`` (``"fill"``
  with 0). Gather-1 and Gather-7 specify only ``[0, s-1]``; xgather follows
  OpenVINO's reference kernels, which wrap negative indices, and its runtime,
  which writes zeros for indices outside, so all three versions agree. (The
  CPU plugin of OpenVINO 2026.4 writes zeros for *negative* indices in
  Gather-1/7: xgather does not copy that.)
* Gather-7/8 ``batch_dims`` may be negative and is then ``b' = indices.ndim +
  batch_dims``; then ``0 <= b' <= min(r, q)`` and ``b' <= axis`` are required.
  This follows the runtime and its reference kernels, which normalise first and
  check after: data of rank 2, indices of rank 4 and ``batch_dims=-4`` give
  ``b' = 0`` and run, though the spec text gives the range ``[-min(r, q),
  min(r, q)]`` (which would reject -4).
* GatherND-5 folds the batch dimensions of the output into one
  (``prod(indices.shape[:b]) + indices.shape[b:-1] + data.shape[b+k:]``);
  GatherND-8 keeps them. Negative indices wrap (as the runtime does). An
  out-of-range index is undefined in OpenVINO (its CPU plugin reads stray
  memory), so xgather's default is ``"error"``.
* GatherElements-6: ``indices`` equals ``data`` in shape except on ``axis``;
  negative indices wrap (as the runtime does); out of range defaults to
  ``"error"``.
* Index types: any integer type for Gather and GatherND (their ``T_IND``); int32
  or int64 for GatherElements-6 (its ``T_IND``; the runtime refuses others).
"""

from __future__ import annotations

import dataclasses
import re
import xml.etree.ElementTree as ET

import numpy as np

from xgather import _dtypes, _frontend, _plan
from xgather._dtypes import ArrayLike, Result, Sharding
from xgather._errors import fail
from xgather._frontend import bool_option, int_attr, shapes, versioned
from xgather._modes import Mode

GATHER_VERSIONS = (1, 7, 8)
"""The Gather versions ``version=`` takes."""
GATHER_ND_VERSIONS = (5, 8)
"""The GatherND versions ``version=`` takes."""
GATHER_ELEMENTS_VERSIONS = (6,)
"""The GatherElements version."""
INDEX_DTYPES = _dtypes.ANY_INTEGER
"""The index dtypes Gather and GatherND take (their ``T_IND``: any integer type)."""
ELEMENTS_INDEX_DTYPES = _dtypes.INT32_INDICES
"""The index dtypes GatherElements-6 takes (its ``T_IND``)."""


def _static_axis(op: str, axis, sh) -> int:
    """The value of an ``axis`` input, which must be known at trace time."""
    if _dtypes.is_traced(axis):
        fail(op, "axis must be known at trace time (a Python int or a concrete scalar); "
             "a traced axis would make the output shape depend on a run-time value",
             type(axis).__name__, sh)
    if isinstance(axis, bool):
        fail(op, "axis must be an integer", repr(axis), sh)
    if isinstance(axis, int):
        return axis
    arr = np.asarray(axis)
    if arr.dtype.kind not in "iu" or arr.size != 1 or arr.ndim > 1:
        fail(op, "axis must be an integer scalar or 1-element 1D array",
             f"{arr.dtype}{list(arr.shape)}", sh)
    return int(arr.reshape(()))


def _gather_plan(data, indices, axis, batch_dims: int = 0, *, version: int = 8,
                 negative_indices=True, **_):
    op = versioned("openvino", "Gather", version, GATHER_VERSIONS, "version")
    sh = shapes(data, indices, op)
    _dtypes.check_index_dtype(op, indices, INDEX_DTYPES, sh)
    r, q = len(sh["data"]), len(sh["indices"])
    ax = _plan.normalize_axis(op, _static_axis(op, axis, sh), r, sh)
    batch_dims = int_attr(op, "batch_dims", batch_dims, sh)
    if version == 1 and batch_dims != 0:
        fail(op, "batch_dims exists from version 7 on", f"batch_dims={batch_dims}", sh)
    # The runtime's rule, not the spec text's: normalise by indices.ndim, then check the range.
    lim = min(r, q)
    b = batch_dims + q if batch_dims < 0 else batch_dims
    if not 0 <= b <= lim:
        fail(op, f"batch_dims must be in [0, min(data.ndim, indices.ndim)] = [0, {lim}] after "
             f"a negative one is normalised by indices.ndim ({q})",
             f"batch_dims={batch_dims}" + (f" (normalised {b})" if batch_dims < 0 else ""), sh)
    return _plan.take_plan(op, sh["data"], sh["indices"], ax, b,
                           bool_option(op, "negative_indices", negative_indices, sh))


def _gather_nd_plan(data, indices, batch_dims: int = 0, *, version: int = 8,
                    negative_indices=True, **_):
    op = versioned("openvino", "GatherND", version, GATHER_ND_VERSIONS, "version")
    sh = shapes(data, indices, op)
    _dtypes.check_index_dtype(op, indices, INDEX_DTYPES, sh)
    batch_dims = int_attr(op, "batch_dims", batch_dims, sh)
    return _plan.nd_plan(op, sh["data"], sh["indices"], batch_dims,
                         bool_option(op, "negative_indices", negative_indices, sh),
                         fold_batch=version == 5)


def _gather_elements_plan(data, indices, axis: int, *, negative_indices=True, **_):
    op = "openvino.GatherElements-6"
    sh = shapes(data, indices, op)
    _dtypes.check_index_dtype(op, indices, ELEMENTS_INDEX_DTYPES, sh)
    ax = _plan.normalize_axis(op, axis, len(sh["data"]), sh)
    return _plan.elements_plan(op, sh["data"], sh["indices"], ax,
                               bool_option(op, "negative_indices", negative_indices, sh),
                               smaller_ok=False)


@_frontend.op(_gather_plan, INDEX_DTYPES, spec_default="fill")
def gather(data: ArrayLike, indices: ArrayLike, axis, batch_dims: int = 0, *, version: int = 8,
           mode: Mode | None = None, fill_value=None, negative_indices: bool = True,
           out_sharding: Sharding = None) -> Result:
    """OpenVINO ``Gather``: ``data[:axis] + indices[batch_dims:] + data[axis+1:]``.

    Args:
      data: array of shape ``(b..., d...)`` with ``len(b) == batch_dims``.
      indices: integer array of shape ``(b..., q...)``; entries in ``[-s, s-1]`` with
        ``s = data.shape[axis]``; outside, the output is 0 (``mode=None``).
      axis: int (or concrete scalar) in ``[-r, r-1]``, ``>= batch_dims`` after normalisation.
      batch_dims: versions 7 and 8; negative values count from ``indices.ndim``.
      version: 1, 7 or 8.
      negative_indices: ``False``: the range is ``[0, s-1]`` and no wrap is
        done (see [`xgather.onnx.gather`][xgather.onnx.gather]).
      mode: as for [`xgather.onnx.gather`][xgather.onnx.gather]; ``mode=None`` is this spec's rule:
        zeros out of range.
      fill_value: as for [`xgather.onnx.gather`][xgather.onnx.gather].
      out_sharding: as for [`xgather.onnx.gather`][xgather.onnx.gather].

    Returns:
      Array of shape ``data.shape[:axis] + indices.shape[b:] + data.shape[axis+1:]``.

    Examples:
        >>> import xgather
        >>> data = [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]
        >>> out = xgather.openvino.gather(data, [[0, 0, 4], [4, 0, 0]], axis=1,
        ...                               batch_dims=1)
        >>> out.tolist()
        [[1, 1, 5], [10, 6, 6]]
    """


@_frontend.op(_gather_nd_plan, INDEX_DTYPES)
def gather_nd(data: ArrayLike, indices: ArrayLike, batch_dims: int = 0, *, version: int = 8,
              mode: Mode | None = None, fill_value=None,
              negative_indices: bool = True, out_sharding: Sharding = None) -> Result:
    """OpenVINO ``GatherND``: slices of ``data`` addressed by index tuples.

    Args:
      data: array of shape ``(b..., d...)``.
      indices: integer array of shape ``(b..., q..., k)``, ``k <= data.ndim - batch_dims``.
      batch_dims: ``0 <= batch_dims < min(data.ndim, indices.ndim)``.
      version: 5 (the output's batch dims folded into one) or 8 (kept).
      negative_indices: as for [`gather`][xgather.openvino.gather].
      mode: as for [`gather`][xgather.openvino.gather]; ``mode=None``: an out-of-range index is an
        error.
      fill_value: as for [`gather`][xgather.openvino.gather].
      out_sharding: as for [`gather`][xgather.openvino.gather].

    Returns:
      Version 8: ``(b..., q..., d[k:]...)``; version 5: ``(prod(b), q..., d[k:]...)``.

    Examples:
        >>> import xgather
        >>> xgather.openvino.gather_nd([[1, 2], [3, 4]], [[0, 0], [1, 0]]).tolist()
        [1, 3]
    """


@_frontend.op(_gather_elements_plan, ELEMENTS_INDEX_DTYPES)
def gather_elements(data: ArrayLike, indices: ArrayLike, axis: int, *,
                    mode: Mode | None = None, fill_value=None,
                    negative_indices: bool = True, out_sharding: Sharding = None) -> Result:
    """OpenVINO ``GatherElements-6``: ``out[i] = data[i_0, .., indices[i], .., i_{r-1}]``.

    ``indices`` has ``data``'s shape except on ``axis``; the output has ``indices``' shape.
    ``negative_indices``, ``mode``, ``fill_value``, ``out_sharding``: as for
    [`gather`][xgather.openvino.gather]
    (``mode=None``: an out-of-range index is an error).

    Examples:
        >>> import xgather
        >>> out = xgather.openvino.gather_elements([[1, 2], [3, 4]], [[0, 0], [1, 0]],
        ...                                        axis=1)
        >>> out.tolist()
        [[1, 1], [4, 3]]
    """


# -- IR layers ----------------------------------------------------------------------------

_IR_OPS = {"Gather": GATHER_VERSIONS, "GatherND": GATHER_ND_VERSIONS,
           "GatherElements": GATHER_ELEMENTS_VERSIONS}


@dataclasses.dataclass(frozen=True)
class IRLayer:
    """A gather layer of an OpenVINO IR, callable on arrays.

    ``inputs`` and ``output`` hold the port dims the IR declares (``None`` for a
    dynamic dim; a port of ``None``, one without ``<dim>``, is a scalar or of
    dynamic rank, which the IR does not tell apart); a call checks its arrays
    against them.
    """

    type: str
    version: int
    opset: str
    attrs: tuple[tuple[str, int], ...]
    inputs: tuple[tuple[int | None, ...] | None, ...]
    output: tuple[int | None, ...] | None
    name: str | None = None
    id: str | None = None

    @property
    def op(self) -> str:
        return f"openvino.{self.type}-{self.version}"

    def __call__(self, data, indices, axis=None, *, mode: Mode | None = None, fill_value=None,
                 out_sharding: Sharding = None):
        attrs = dict(self.attrs)
        for port, x in enumerate((data, indices)):
            self._check_dims(f"input port {port}", self.inputs[port] if port < len(self.inputs)
                             else None, _dtypes.shape_of(x))
        if self.type != "Gather" and axis is not None:
            fail(self.op, "only a Gather layer takes an axis input (port 2)", repr(axis))
        if self.type == "Gather":
            if axis is None:
                fail(self.op, "the axis input (port 2) must be given: the IR holds it in a "
                     "separate Const layer", None)
            if len(self.inputs) > 2:
                self._check_dims("input port 2", self.inputs[2], _dtypes.shape_of(axis))
            out = gather(data, indices, axis, attrs.get("batch_dims", 0), version=self.version,
                         mode=mode, fill_value=fill_value, out_sharding=out_sharding)
        elif self.type == "GatherND":
            out = gather_nd(data, indices, attrs.get("batch_dims", 0), version=self.version,
                            mode=mode, fill_value=fill_value, out_sharding=out_sharding)
        else:
            out = gather_elements(data, indices, attrs.get("axis", 0), mode=mode,
                                  fill_value=fill_value, out_sharding=out_sharding)
        self._check_dims("output port", self.output, tuple(out.shape))
        return out

    def _check_dims(self, where, declared, got):
        if declared is None:
            return
        if len(declared) != len(got) or any(d is not None and d != g
                                             for d, g in zip(declared, got, strict=True)):
            fail(self.op, f"the IR declares {where} dims {list(declared)}", str(list(got)))

    def to_xml(self) -> str:
        """The ``<layer>`` element again: its id, name, type, version, attributes and
        port dims as parsed. Ports are numbered from 0 in order (inputs, then the
        output); their precisions and names are not kept."""
        layer = ET.Element("layer", {**({"id": self.id} if self.id is not None else {}),
                                     **({"name": self.name} if self.name else {}),
                                     "type": self.type, "version": self.opset})
        if self.attrs:
            ET.SubElement(layer, "data", {k: str(v) for k, v in self.attrs})
        ports = ET.SubElement(layer, "input")
        for i, dims in enumerate(self.inputs):
            _port(ports, i, dims)
        if self.output is not None:
            _port(ET.SubElement(layer, "output"), len(self.inputs), self.output)
        return ET.tostring(layer, encoding="unicode")


def _port(parent, i: int, dims) -> None:
    port = ET.SubElement(parent, "port", {"id": str(i)})
    for d in dims or ():
        ET.SubElement(port, "dim").text = "-1" if d is None else str(d)


def _ir_int(op: str, what: str, text) -> int:
    """An IR integer: ASCII digits with an optional minus sign, as OpenVINO's reader
    takes them (Python's ``int`` would also read ``"1_0"`` as 10, ``"+1"``, other
    scripts' digits)."""
    if not isinstance(text, str) or not _IR_INT.fullmatch(text.strip()):
        fail(op, f"{what} must be an integer (ASCII digits, an optional minus sign)",
             repr(text))
    return int(text)


_IR_INT = re.compile(r"-?[0-9]+")


def _dims(op: str, port) -> tuple[int | None, ...] | None:
    """A port's dims (None for a dynamic one); None for a port without ``<dim>``, which
    OpenVINO writes for a scalar and for a dynamic rank alike."""
    dims = tuple(_ir_int(op, "a port's <dim>", d.text) for d in port.findall("dim"))
    return tuple(None if d < 0 else d for d in dims) if dims else None


#: The attributes of each IR layer's <data> element, by op version (None: required).
_IR_ATTRS: dict[tuple[str, int], dict[str, int | None]] = {
    ("Gather", 1): {}, ("Gather", 7): {"batch_dims": 0}, ("Gather", 8): {"batch_dims": 0},
    ("GatherND", 5): {"batch_dims": 0}, ("GatherND", 8): {"batch_dims": 0},
    ("GatherElements", 6): {"axis": None}}


def from_ir_layer(layer) -> IRLayer:
    """An IR ``<layer type="Gather*" version="opsetN">`` (Element or XML text) as a callable.

    The version of the op follows the opset: Gather-1 up to opset6, Gather-7
    in opset7, Gather-8 from opset8; GatherND-5 up to opset7, GatherND-8 from
    opset8; GatherElements-6 from opset6.
    """
    where = "openvino.from_ir_layer"
    if isinstance(layer, str | bytes):
        try:
            layer = ET.fromstring(layer)
        except ET.ParseError as e:
            fail(where, "layer must be well-formed XML", str(e))
    if not isinstance(layer, ET.Element):
        fail(where, "layer must be XML text or an xml.etree.ElementTree.Element",
             type(layer).__name__)
    kind, opset = layer.get("type"), layer.get("version", "")
    if kind not in _IR_OPS:
        fail("openvino.from_ir_layer", f"layer type must be one of {', '.join(_IR_OPS)}",
             repr(kind))
    m = re.fullmatch(r"opset(\d+)", opset)
    if not m:
        fail("openvino.from_ir_layer", 'version must look like "opsetN"', repr(opset))
    n = int(m.group(1))
    versions = [v for v in _IR_OPS[kind] if v <= n]
    if not versions:
        fail(f"openvino.{kind}", f"{kind} exists from opset{_IR_OPS[kind][0]} on", opset)
    op = f"openvino.{kind}-{versions[-1]}"
    known = _IR_ATTRS[(kind, versions[-1])]
    data = layer.find("data")
    given = dict(data.attrib) if data is not None else {}
    for name in given:
        if name not in known:
            fail(op, "unknown attribute in <data>; the layer takes "
                 + (", ".join(known) or "none"), repr(name))
    for name, default in known.items():
        if default is None and name not in given:
            fail(op, f"the <data> attribute {name} is required", None)
    attrs = tuple(sorted((k, _ir_int(op, f"attribute {k}", v)) for k, v in given.items()))
    inputs = tuple(_dims(op, p) for p in layer.findall("input/port"))
    ports = (2, 3) if kind == "Gather" else (2,)
    if inputs and len(inputs) not in ports:
        fail(op, f"the layer takes {' or '.join(map(str, ports))} input ports",
             f"{len(inputs)} ports")
    outs = layer.findall("output/port")
    if len(outs) > 1:
        fail(op, "a gather layer has one output port", f"{len(outs)} ports")
    return IRLayer(kind, versions[-1], opset, attrs, inputs,
                   _dims(op, outs[0]) if outs else None, layer.get("name"), layer.get("id"))


__all__ = ["ELEMENTS_INDEX_DTYPES", "GATHER_ELEMENTS_VERSIONS", "GATHER_ND_VERSIONS",
           "GATHER_VERSIONS", "INDEX_DTYPES", "IRLayer", "from_ir_layer", "gather",
           "gather_elements", "gather_nd"]
