"""The LabVIEW Deep Learning ``Gather`` block.

Forward, it is ONNX ``Gather-13`` (negative indices count from the end, an
out-of-range index is an error). Backward, its two parameters shape the
gradient sent to ``data``:

* ``lda_coeff`` ("lda coeff", default 1) multiplies the loss derivative
  before it is sent back: ``d data = lda_coeff * scatter_add(cotangent)``.
* ``training=False`` ("training?") sends no gradient back (zero).

Both hold in forward mode too (the derivative is a ``jax.custom_jvp``), so
``jax.jvp``, ``jax.jacfwd`` and ``jax.hessian`` agree with reverse mode.
``name`` and ``specified_outputs_name`` label the op (``jax.named_scope``):
they show in the lowered program, in profiles, and in ``xgather.explain``.
"""

from __future__ import annotations

import numpy as np

from xgather import _dtypes, _frontend, _plan
from xgather._dtypes import ArrayLike, Result, Sharding
from xgather._errors import fail
from xgather._frontend import bool_option, shapes
from xgather._modes import Mode

INDEX_DTYPES = _dtypes.INT32_INDICES
"""The index dtypes the LabVIEW block takes."""


def _label(name, specified_outputs_name) -> str:
    op = "labview.Gather"
    outs = specified_outputs_name
    if name is not None and not isinstance(name, str):
        fail(op, "name must be a str", repr(name))
    if outs is not None and not (isinstance(outs, str) or (
            isinstance(outs, list | tuple) and all(isinstance(o, str) for o in outs))):
        fail(op, "specified_outputs_name must be a str or a list of str", repr(outs))
    if name:
        op += f"[{name}]"
    if specified_outputs_name:
        outs = specified_outputs_name
        outs = ",".join(outs) if isinstance(outs, list | tuple) else str(outs)
        op += f"->{outs}"
    return op


def _gather_plan(data, indices, axis: int = 0, *, name=None, specified_outputs_name=None,
                 negative_indices=True, **_):
    op = _label(name, specified_outputs_name)
    sh = shapes(data, indices, op)
    _dtypes.check_data_type(op, data, _dtypes.ONNX_DATA_13, sh)  # the block's T
    _dtypes.check_index_dtype(op, indices, INDEX_DTYPES, sh)
    ax = _plan.normalize_axis(op, axis, len(sh["data"]), sh)
    return _plan.take_plan(op, sh["data"], sh["indices"], ax, 0,
                           bool_option(op, "negative_indices", negative_indices, sh))


def _lda_gradient(plan, training, lda_coeff, **_) -> tuple[bool, float]:
    """The ``training?`` flag and ``lda coeff``, which shape the derivative
    (``xgather._grad``)."""
    training = bool_option(plan.op, "training", training, note=" (known when tracing)")
    if isinstance(lda_coeff, bool | np.bool_) or not isinstance(lda_coeff, int | float | np.integer
                                                                | np.floating):
        fail(plan.op, "lda_coeff must be a real number (known when tracing)", repr(lda_coeff))
    return training, float(lda_coeff)


@_frontend.op(_gather_plan, INDEX_DTYPES, gradient=_lda_gradient)
def gather(data: ArrayLike, indices: ArrayLike, axis: int = 0, *, training: bool = True,
           lda_coeff: float = 1.0, name: str | None = None, specified_outputs_name=None,
           mode: Mode | None = None, fill_value=None, negative_indices: bool = True,
           out_sharding: Sharding = None) -> Result:
    """LabVIEW ``Gather``: ONNX Gather-13 forward, a scaled (or no) gradient backward.

    Args:
      data: array of rank ``r >= 1``.
      indices: int32/int64 array of shape ``(q...)``, entries in ``[-s, s-1]``.
      axis: in ``[-r, r-1]``.
      training: ``False`` sends a zero gradient to ``data``.
      lda_coeff: multiplies the gradient sent to ``data``.
      name: the label of the node.
      specified_outputs_name: the label of its output.
      mode: as for [`xgather.onnx.gather`][xgather.onnx.gather].
      fill_value: as for [`xgather.onnx.gather`][xgather.onnx.gather].
      negative_indices: as for [`xgather.onnx.gather`][xgather.onnx.gather].
      out_sharding: as for [`xgather.onnx.gather`][xgather.onnx.gather].

    Returns:
      Array of shape ``data.shape[:axis] + (q...) + data.shape[axis+1:]``.

    Examples:
        >>> import jax, jax.numpy as jnp, xgather
        >>> ids = jnp.array([0, 0, 2])
        >>> f = lambda d: xgather.labview.gather(d, ids, lda_coeff=0.5).sum()
        >>> jax.grad(f)(jnp.ones(3)).tolist()
        [1.0, 0.0, 0.5]
    """


__all__ = ["INDEX_DTYPES", "gather"]
