"""The derivative of every op: JAX's transpose of ``lax.gather``, except where a
spec reshapes it or where the data's precision would not hold the sum.

JAX transposes a gather into a scatter-add in the same out-of-bounds mode. Two
cases take a derivative defined here with ``jax.custom_jvp`` instead (so forward
mode, reverse mode and ``jax.hessian`` all work):

- LabVIEW's ``lda coeff`` and ``training?``: the tangent of the output is
  ``coeff * gather(tangent of data)``, which JAX transposes into
  ``coeff * scatter_add(cotangent)``. With ``training=False`` the tangent is
  zero, so no gradient reaches ``data``.
- Floating data narrower than float32 (bfloat16, float16, float8): the tangent is
  gathered in float32 and rounded once, so that the gradient's scatter-add sums
  in float32 and rounds each row's sum once (as torch's embedding backward
  does), instead of rounding after every addition: summed in bfloat16, the
  gradient of a row that 256 lookups hit was off by about 7%. The forward values
  (output and tangent) are the same either way.

The scatter-add itself comes in two forms ([`grad_scatter`][xgather.grad_scatter]): ``"direct"``,
JAX's transpose as it is, and ``"sorted"``, where the indices are sorted first,
so that the scatter-add receives them with ``indices_are_sorted=True``. A GPU
then sums each run of equal indices in registers and writes it once, instead of
one atomic add per lookup (the atomics are what collapses under contention on
some jaxlib versions: openxla/xla#46225, #26371). The price is a sort of the
indices and a permutation of the cotangent. On XLA:CPU the scatter is a loop
either way, so ``"direct"`` is the default everywhere until a GPU measurement
(the bench's ``xgather[promise,sorted]`` beside ``xgather[promise]`` on the
gradient workloads) says otherwise.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from xgather import _modes, _plan
from xgather._gather import gather_prepared

#: The forms of the gradient's scatter-add (see [`grad_scatter`][xgather.grad_scatter]).
GRAD_SCATTERS = ("direct", "sorted")


#: The form of the gradient's scatter-add ([`grad_scatter`][xgather.grad_scatter]), a JAX
#: config state in the trace context and the jit dispatch key (``xgather._modes.TraceState``):
#: ``jax.config.update("xgather_grad_scatter", ...)`` sets it for the process, the
#: ``XGATHER_GRAD_SCATTER`` environment variable at import.
_SCATTER = _modes.TraceState(
    "xgather_grad_scatter", GRAD_SCATTERS, "direct",
    "The form of the scatter-add in the gradient of xgather's gathers: direct "
    "(JAX's transpose) or sorted (indices sorted first).")


def grad_scatter(kind: str):
    """Trace the gradients of xgather's gathers with the scatter-add ``kind``:

    * ``"direct"`` (the default): JAX's transpose of ``lax.gather``, one
      scatter-add of the cotangent at the indices as given.
    * ``"sorted"``: the indices are sorted (stably) and the tangent gathered at
      them with ``indices_are_sorted=True``, then put back in order, so that the
      transpose is a permutation of the cotangent and a scatter-add of sorted
      indices: on a GPU, one write per run of equal indices instead of one
      atomic add per lookup. Gathers along one axis without batch dimensions
      (ONNX and OpenVINO ``Gather``, BNNS and LabVIEW gathers) take it; other
      plans keep ``"direct"`` (``xgather.explain`` says which), as do calls given
      ``out_sharding`` or ``unique_indices=True`` (outside ``"clip"``: unique
      positions take no atomics to begin with).

    The values are the same up to the order of the additions. Read when a
    gradient is traced, like [`xgather.default_mode`][xgather.default_mode]; for a whole process,
    ``jax.config.update("xgather_grad_scatter", "sorted")`` or the environment
    variable ``XGATHER_GRAD_SCATTER=sorted``.
    """
    return _SCATTER.traced_as(kind, "xgather.grad_scatter")


def current_scatter() -> str:
    """The scatter-add form asked for here (``"direct"`` where JAX has no such state)."""
    return _SCATTER.value


def _sortable(plan) -> str | None:
    """Why ``plan``'s gradient cannot take the sorted scatter-add (None: it can)."""
    if plan.index_vector or plan.batch_dims or len(plan.index_axes) != 1:
        return "it gathers index tuples, elements or batches, not slices along one axis"
    if plan.lowering != "vmap" or plan.index_broadcast or plan.data_crop is not None:
        return f"its lowering ({plan.lowering}) is not one gather of rows"
    if 0 in plan.bounds or 0 in plan.indices_shape:
        return "it has no index or no position to sort"
    return None


def scatter_form(plan, data_dtype) -> str:
    """The scatter-add form a gradient of ``plan`` traced here takes (see
    [`grad_scatter`][xgather.grad_scatter])."""
    if current_scatter() == "direct" or _sortable(plan) is not None:
        return "direct"
    if not jnp.issubdtype(data_dtype, jnp.inexact):
        return "direct"  # no gradient flows to integer data
    return "sorted"


def scatter_text(plan) -> str:
    """What ``explain`` says of the gradient's scatter-add."""
    what = "gradient: "
    if current_scatter() == "direct":
        return what + "one scatter-add at the indices as given (grad_scatter 'direct')"
    why = _sortable(plan)
    if why is None:
        return what + ("indices sorted first, then a scatter-add of sorted runs "
                       "(grad_scatter 'sorted')")
    return what + f"one scatter-add at the indices as given: 'sorted' does not apply, as {why}"


def accumulation(dtype) -> np.dtype | None:
    """The dtype a gradient of ``dtype`` data sums in, where it is not ``dtype`` itself."""
    dtype = np.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize < 4:
        return np.dtype(np.float32)
    return None


def tangent(gather, t_data, grad=None):
    """``gather(t_data)`` (linear in ``t_data``) as this module's derivative shapes it.

    ``grad``: ``None`` or LabVIEW's ``(training, coeff)``; the gather runs in
    ``accumulation``'s dtype where there is one, then rounds to ``t_data``'s.
    """
    training, coeff = (True, 1.0) if grad is None else grad
    acc = accumulation(t_data.dtype)
    out = gather(t_data if acc is None else t_data.astype(acc))
    if not training:
        return jnp.zeros(out.shape, t_data.dtype)
    if coeff != 1.0:
        out = out * jnp.asarray(coeff, out.dtype)
    return out.astype(t_data.dtype)


def gather(plan, mode, fill_value, hints, grad, data, idx):
    """``gather_prepared(plan, ...)(data, idx)``, with this module's derivative where it
    applies (``grad`` given, data that ``accumulation`` widens, or the sorted
    scatter-add chosen: [`grad_scatter`][xgather.grad_scatter])."""
    # Promised-unique positions need no atomics to begin with (a GPU stores them),
    # unless clamping may merge them; out_sharding keeps the placed form.
    direct = hints.out_sharding is not None or (hints.unique_indices and mode != "clip")
    form = "direct" if direct else scatter_form(plan, data.dtype)
    if grad is None and accumulation(data.dtype) is None and form == "direct":
        return gather_prepared(plan, mode, fill_value, hints, data, idx)
    return _custom(plan, mode, fill_value, hints, grad, form, data, idx)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 2, 3, 4, 5))
def _custom(plan, mode, fill_value, hints, grad, form, data, idx):
    return gather_prepared(plan, mode, fill_value, hints, data, idx)


def _custom_jvp(plan, mode, fill_value, hints, grad, form, primals, tangents):
    data, idx = primals
    t_data, _ = tangents  # symbolic zeros: the indices' float0 tangent is never made
    out = _custom(plan, mode, fill_value, hints, grad, form, data, idx)
    if isinstance(t_data, jax.custom_derivatives.SymbolicZero):
        t_data = jnp.zeros(t_data.shape, t_data.dtype)
    # Linear in t_data (filled slots have tangent 0), so JAX can transpose it for
    # reverse mode.
    if form == "sorted":
        linear = functools.partial(_sorted_gather, plan, mode, hints, idx)
    else:
        def linear(t):
            return gather_prepared(plan, mode, 0, hints, t, idx)
    return out, tangent(linear, t_data, grad)


def _sorted_gather(plan, mode, hints, idx, t):
    """``gather_prepared(plan, mode, 0, hints, t, idx)``, computed at the indices sorted
    and then put back in order. Both steps are gathers, so JAX transposes them into a
    scatter-add that permutes the cotangent (unique indices) and one of sorted indices.

    The indices are the prepared ones (wrapped, narrowed), so that the order is that
    of the positions read; clamping (``"clip"``) keeps it, and out-of-range ones
    (``"fill"``) sort to the ends, where the scatter drops them.
    """
    axis = plan.index_axes[0]
    flat = idx.reshape(-1)
    n = flat.size
    order = jnp.argsort(flat, stable=True)  # stable: the same sums on every run
    keys = flat[order]
    rows_plan = _plan.take_plan(plan.op, plan.data_shape, (n,), axis, 0, plan.negative,
                                plan.platform)
    rows = gather_prepared(rows_plan, mode, 0, hints._replace(indices_are_sorted=True), t, keys)
    position = jnp.zeros_like(order).at[order].set(jnp.arange(n, dtype=order.dtype),
                                                   unique_indices=True)
    back_plan = _plan.take_plan(plan.op, rows.shape, (n,), axis, 0, False, plan.platform)
    back = gather_prepared(back_plan, "promise_in_bounds", 0,
                           hints._replace(indices_are_sorted=False, unique_indices=True),
                           rows, position)
    return back.reshape(plan.out_shape)


_custom.defjvp(_custom_jvp, symbolic_zeros=True)
