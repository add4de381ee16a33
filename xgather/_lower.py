"""Every lowering choice that is not the spec's, in one place: per platform, and per size.

A plan (``xgather._plan``) holds what a spec asks (the output's shape, which axes
the indices address, the bounds); how that becomes ``lax.gather`` may differ by
platform without changing a value. The choices, each exact on every platform:

* ``row_batching``: a gather along an inner axis makes the dims before the axis
  batching dims, so that XLA:CPU writes the output in order instead of gathering
  columns and transposing them. Other platforms take ``jax.vmap`` (XLA's own layout
  assignment handles the transpose there).
* ``flag``: how the ``"error"`` mode's flag is reduced: ``"float max"`` (XLA:CPU: a
  float32 max, blocked, which a library kernel runs) or ``"any"`` (``jnp.any``).
* ``element_gather``: how gathers of single elements (GatherElements, and GatherND
  whose index tuples address every axis) are lowered: ``"batching_dims"`` (XLA
  batching dimensions, no index tuples) or ``"linear"`` (one linear index into the
  flattened data, which is how torch's kernels address them).
* ``wrap``: where negative indices are wrapped. ``"fused"``: inside the gather's
  index computation, at every size (a compare and a select per index read; no
  branch). ``"by_size"`` (XLA:CPU, measured there): fused for small gathers and wide
  slices, and for larger gathers of narrow slices in a branch of a conditional, taken
  only when some index is negative (``wrap_pass``). An accelerator takes ``"fused"``:
  XLA:GPU reads a conditional's predicate on the host, so a branch would make the
  host wait for the device in the middle of the program.

Not a choice: 64-bit indices into axes that int32 can count are saturated into the
int32 range on every platform (``xgather._indices.saturate_64``), since XLA:CPU and
XLA:GPU both keep only their low 32 bits.

The platform is JAX's default backend when the plan is made. [`lowering`][xgather.lowering] sets
another for a block (to trace another platform's choices here, or to choose the element
lowering); the export traces with a fixed one, so that its graph is the same wherever
it is traced.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import threading

import jax

from xgather._errors import fail

#: The platforms whose choices are written down; any other takes ``"tpu"``'s (the plain
#: forms, with no XLA:CPU workaround).
PLATFORMS = ("cpu", "gpu", "tpu")
#: The lowerings of element gathers (see the module docstring).
ELEMENT_GATHERS = ("batching_dims", "linear")
#: Where negative indices are wrapped (see the module docstring).
WRAPS = ("by_size", "fused")
#: The platform whose choices an export traces with (its graph is the same everywhere).
EXPORT_PLATFORM = "cpu"


@dataclasses.dataclass(frozen=True)
class Choices:
    """One platform's lowering choices (see the module docstring)."""

    platform: str
    row_batching: bool
    flag: str
    element_gather: str = "batching_dims"
    wrap: str = "fused"


#: The choices per platform. ``element_gather`` stays ``"batching_dims"`` everywhere until
#: a GPU measurement shows the linear form paying (``.ci/gpu`` times both; on an H200,
#: jax 0.11.2, the two were level).
TABLE = {
    "cpu": Choices("cpu", row_batching=True, flag="float max", wrap="by_size"),
    "gpu": Choices("gpu", row_batching=False, flag="any"),
    "tpu": Choices("tpu", row_batching=False, flag="any"),
}

_ALIASES = {"cuda": "gpu", "rocm": "gpu"}


def _env_element_gather() -> dict[str, str]:
    """``XGATHER_ELEMENT_GATHER``: ``linear`` (every platform) or ``gpu=linear,cpu=...``."""
    text = os.environ.get("XGATHER_ELEMENT_GATHER", "").strip()
    if not text:
        return {}
    chosen = {}
    for part in text.split(","):
        platform, _, kind = part.rpartition("=")
        platforms = [platform.strip()] if platform else list(PLATFORMS)
        if kind.strip() not in ELEMENT_GATHERS or not set(platforms) <= set(PLATFORMS):
            raise ValueError(f"XGATHER_ELEMENT_GATHER={text!r}: each part must be KIND or "
                             f"PLATFORM=KIND with KIND in {ELEMENT_GATHERS} and PLATFORM in "
                             f"{PLATFORMS}")
        chosen.update(dict.fromkeys(platforms, kind.strip()))
    return chosen


for _name, _kind in _env_element_gather().items():
    TABLE[_name] = dataclasses.replace(TABLE[_name], element_gather=_kind)


@dataclasses.dataclass(frozen=True)
class _Override:
    platform: str | None = None
    element_gather: str | None = None
    wrap: str | None = None


_lock = threading.Lock()
_override: _Override | None = None


def override() -> _Override | None:
    """What [`lowering`][xgather.lowering] set (None outside it): part of the eager cache's key."""
    return _override


def platform(name: str | None = None) -> str:
    """The platform a plan's lowering is chosen for: ``name``, else the one
    [`lowering`][xgather.lowering] set, else JAX's default backend (``"cuda"`` and ``"rocm"`` are
    ``"gpu"``)."""
    forced = _override.platform if _override is not None else None
    name = name or forced or jax.default_backend()
    return _ALIASES.get(name, name)


def choices(name: str | None = None) -> Choices:
    """The lowering choices for platform ``name`` (see ``platform``)."""
    name = platform(name)
    chosen = TABLE.get(name) or dataclasses.replace(TABLE["tpu"], platform=name)
    if _override is not None and _override.element_gather is not None:
        chosen = dataclasses.replace(chosen, element_gather=_override.element_gather)
    if _override is not None and _override.wrap is not None:
        chosen = dataclasses.replace(chosen, wrap=_override.wrap)
    return chosen


@contextlib.contextmanager
def lowering(platform: str | None = None, *, element_gather: str | None = None,
             wrap: str | None = None):
    """Trace xgather's gathers with another platform's lowering choices, or another
    element-gather lowering or negative wrap, inside the block.

    Every lowering is exact on every platform, so this changes speed, never values:
    it lets a CPU machine run (and test) what a GPU would, and a GPU measure the
    element lowerings side by side. It applies to what is traced inside the block
    (eager calls, and jitted functions traced there: a jitted function keeps the
    lowering it was traced with). One block at a time per process.

    Args:
      platform: ``"cpu"``, ``"gpu"`` or ``"tpu"`` (None: JAX's default backend).
      element_gather: ``"batching_dims"`` or ``"linear"`` (None: the platform's).
      wrap: where negative indices are wrapped: ``"fused"`` (in the gather, no branch)
        or ``"by_size"`` (XLA:CPU's rule: a branch for larger gathers of narrow
        slices); None: the platform's.

    Examples:
        >>> import numpy as np, xgather
        >>> with xgather.lowering("gpu"):
        ...     plan = xgather.explain(xgather.onnx.gather, np.zeros((3, 4)),
        ...                            np.zeros(2, int), 1)
        >>> plan.platform, plan.lowering
        ('gpu', 'vmap')
    """
    global _override
    if platform is not None and _ALIASES.get(platform, platform) not in PLATFORMS:
        fail("xgather.lowering", f"platform must be one of {PLATFORMS}", repr(platform))
    if element_gather is not None and element_gather not in ELEMENT_GATHERS:
        fail("xgather.lowering", f"element_gather must be one of {ELEMENT_GATHERS}",
             repr(element_gather))
    if wrap is not None and wrap not in WRAPS:
        fail("xgather.lowering", f"wrap must be one of {WRAPS}", repr(wrap))
    with _lock:
        outer = _override
        _override = _Override(_ALIASES.get(platform, platform) if platform else
                              (outer.platform if outer else None),
                              element_gather or (outer.element_gather if outer else None),
                              wrap or (outer.wrap if outer else None))
    try:
        yield
    finally:
        with _lock:
            _override = outer


# -- where negative indices are wrapped: by size, where the platform's choice is "by_size" -----

#: Output elements from which the negative wrap gets a pass of its own (skipped when no
#: index is negative); below, it is computed inside the gather, where a branch would cost more.
SEPARATE_WRAP = 1 << 14
#: Elements copied per index from which the wrapped indices leave their branch (row
#: gathers); below, the gather goes into the branch (element gathers: a copy of the indices
#: out of a conditional would cost about as much as the gather).
ROWS = 4
#: Elements of one slice (prod(slice_sizes)) from which the wrap stays inside the gather at
#: any size: the index is then loaded once per slice and the wrap with it, out of the copy
#: loop, and no kernel is added to compile (measured: docs/lowering.md).
ROW_SLICE = 8


def known(n) -> bool:
    """Whether a dim is a number, not a symbolic one (``jax.export``'s ``"B"``)."""
    return isinstance(n, int)


def _sizes_known(*shapes) -> bool:
    return all(known(n) for shape in shapes for n in shape)


def small(plan) -> bool:
    """Whether ``plan``'s gather writes fewer than ``SEPARATE_WRAP`` values: a program of
    microseconds, where work beside the gather costs more per call than to compile.
    A symbolic size (``jax.export``'s ``"B"``) counts as large."""
    return _sizes_known(plan.out_shape) and math.prod(plan.out_shape) < SEPARATE_WRAP


def wrap_pass(plan) -> str:
    """Where ``plan``'s negative indices are wrapped: ``"fused"``, ``"separate"`` or
    ``"gather"`` (see ``xgather._plan.Plan.wrap_pass``). Always ``"fused"`` where the
    plan's platform choice (``plan.wrap``) is, and with a symbolic size: the branch's
    choice needs numbers, and the fused wrap is exact at any."""
    if plan.wrap == "fused" or not _sizes_known(plan.out_shape, plan.indices_shape):
        return "fused"
    n, out = plan.index_count, math.prod(plan.out_shape)
    if not n or small(plan) or math.prod(plan.slice_sizes) >= ROW_SLICE:
        return "fused"
    return "separate" if out >= ROWS * n else "gather"


__all__ = ["ELEMENT_GATHERS", "PLATFORMS", "TABLE", "WRAPS", "Choices", "choices", "lowering",
           "platform", "wrap_pass"]
