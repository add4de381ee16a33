"""The ``"error"`` mode's check: the flag, and the check of concrete and traced indices.

The check lives in three modules, read in this order:

1. **The flag** (here, and ``xgather._indices.out_of_range``): one boolean, "some index
   lies outside the spec's range", reduced beside the gather in the form each backend
   runs fastest: what an eager call on device indices reads.
2. **The check**: concrete indices on the host (``host_check``); traced ones get a
   ``checkify`` check (``emit``) whose one reduction gives the flag, the count and the
   first position; ``traced`` says where a traced check may go (under a ``checkify``
   that keeps user checks, so under [`checked`][xgather.checked], else a clear error at
   trace time).
3. **The report** (``xgather._report``): the op, the first bad index as given, its
   position, the valid range and the count, as a message and as the error's attributes.
4. **When a failure is raised** (``xgather._checked``: ``checked``, its queue of flags).

Eager calls raise at the call: NumPy indices are checked on the host while the
gather runs; device indices by a program that returns the flag beside the result
(``xgather._apply.eager_runner``). ``gather`` puts the check beside a gather.
"""

from __future__ import annotations

import functools
import math
import sys
import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import checkify

from xgather import _dtypes, _indices, _jaxprivate, _patches, _report
from xgather._errors import NODE, OutOfBoundsError, UncheckedWarning, fail, named
from xgather._gather import Call
from xgather._modes import TraceState

# -- 1. the flag -------------------------------------------------------------------------------

def gather(call: Call, data, indices, *, flag: bool = False):
    """``(bad, out)``: ``call``'s gather (``xgather._indices.gather``), checked.

    In the ``"error"`` mode the traced check goes in beside it (``emit``), whose flag
    ``bad`` is; with ``flag`` (an eager call on device indices) ``bad`` is the flag
    alone, which the caller reads; otherwise ``bad`` is None. A program that checks
    wraps negative indices inside the gather.
    """
    checks = call.mode == "error" or flag
    bad = _flag(call.plan, indices, call.mode == "error", call.where) if checks else None
    return bad, _indices.gather(call, data, indices, inline_wrap=checks)


def _flag(plan, indices, report: bool, where: str | None = None):
    """The traced check (``report``: ``emit``), or the flag alone
    (``xgather._indices.out_of_range``)."""
    if not report:
        return _indices.out_of_range(plan, indices)
    return emit(plan, _indices.fit_dtype(plan, indices), where)


def flag_text(plan) -> str:
    """What ``explain`` says of the flag that the ``"error"`` mode's check reduces."""
    n = math.prod(plan.indices_shape)
    if isinstance(n, int) and n == 0:
        return 'bound check (mode="error"): no index to check'
    return ('bound check (mode="error"): under a transformation, one reduction over the '
            f"{n} index values counts the bad ones and finds the first; on device indices "
            "eagerly, " + _indices.any_form(n, plan.flag_form, pad=not plan.small))


# -- 2. the report: xgather._report; the check of concrete indices ---------------------------

def _count_first(plan, indices):
    """``(count, first)`` of the indices outside the spec's range: how many, and the flat
    position of the first (its size where none is), in one variadic reduction."""
    bad = lax.reshape(lax.bitwise_not(_indices.valid(plan, indices, jnp)), (indices.size,))
    n = bad.size
    if isinstance(n, int):
        kind = jnp.int64 if n >= np.iinfo(np.int32).max else jnp.int32
    else:  # a symbolic size (jax.export): as wide as this JAX's integers
        kind = jnp.int64 if _dtypes.x64() else jnp.int32
    count = lax.convert_element_type(bad, kind)
    first = lax.select(bad, lax.iota(kind, n), lax.full((n,), n, kind))
    # One pass. Tried on XLA:CPU (jax 0.10.2 and 0.12.0.1) and slower, in time and in
    # compilation: a first stage over (rows, lanes) blocks, as the flag's, in integers or
    # in float32 sums (then the first bad one in its block); two float32 reductions (a sum,
    # and a max of reversed positions); a float32 max for the flag and the first with the
    # count under lax.cond. Each gave 1.5-2x the check's time on 1M indices.
    return lax.reduce((count, first), (kind(0), kind(n)), _add_min, (0,))


def _add_min(a, b):
    """``_count_first``'s reducer: one function, whose traced form JAX keeps (a new lambda
    at every trace was traced again)."""
    return lax.add(a[0], b[0]), lax.min(a[1], b[1])


def host_check(plan, indices) -> None:
    """The check on concrete indices, raising
    [`OutOfBoundsError`][xgather.OutOfBoundsError] at once (``xgather._report.host_check``).
    Indices that other processes hold part of (``jax.distributed``) are checked on the
    devices, every process raising the same error."""
    if isinstance(indices, jax.Array) and not indices.is_fully_addressable:
        _device_checker(plan)(indices)
        return
    _report.host_check(plan, indices)


@functools.lru_cache(maxsize=256)
def _device_checker(plan):
    """The traced check alone, read at once: for indices this process cannot read whole."""
    def check(indices):
        with TRACING.traced_as("yes"):  # the compact report (``_site``)
            emit(plan, indices)
    program = jax.jit(checkify.checkify(check, errors=CHECKED_ERRORS))

    def run(indices) -> None:
        msg = program(indices)[0].get()
        if msg is not None:
            raise _report.site_error(msg) or OutOfBoundsError(msg)
    run.program = program  # what a test lowers
    return run


def replicated(x):
    """``x``, replicated where it is sharded over a mesh's Explicit axes: there JAX asks
    every indexed read for its result's sharding, and the report reads single values."""
    try:
        sharding = jax.typeof(x).sharding
        explicit = sharding.mesh.explicit_axes
    except AttributeError:  # pragma: no cover - other JAX versions
        return x
    if explicit and any(entry is not None for entry in sharding.spec):
        return jax.sharding.reshard(x, jax.sharding.NamedSharding(sharding.mesh,
                                                                  jax.sharding.PartitionSpec()))
    return x


def emit(plan, indices, where: str | None = None):
    """The traced check: a checkify check on whether some index is out of range, which
    carries the report and ``where``, the user's file and line (found here where not
    given); returns that flag.

    One variadic reduction over the indices gives the flag, the count of bad indices
    and the first one's flat position. Under [`checked`][xgather.checked] the check carries those
    and the first bad value alone, and the host makes the report from them when it
    raises (``site_error``): the scalar work of the report compiles slower than
    the reduction. Under a ``checkify`` of the user's, the device makes the whole
    report, which that ``checkify`` formats.
    """
    if indices.size == 0:
        return jnp.zeros((), bool)
    indices = replicated(indices)
    count, first = _count_first(plan, indices)
    bad = lax.gt(count, np.zeros((), count.dtype))
    where = call_site() if where is None else where
    if TRACING.value == "yes" and _jaxprivate.checkify_errors() is CHECKED_ERRORS:
        # checked's own checkify (not a user's inside it): in lax ops, as _count_first
        dtype = indices.dtype
        value = lax.dynamic_slice(lax.reshape(indices, (indices.size,)), (first,), (1,))
        report = lax.concatenate([lax.broadcast(lax.convert_element_type(count, dtype), (1,)),
                                  lax.broadcast(lax.convert_element_type(first, dtype), (1,)),
                                  value], 0)
        checkify.check(lax.bitwise_not(bad), _report._site(plan, indices.shape, where), report)
    else:
        site, _, node = where.partition("|")
        text = _report.report_format(plan, indices.ndim, site)
        if node:
            text = named(text, node.replace("{", "{{").replace("}", "}}"))
        checkify.check(lax.bitwise_not(bad), text,
                       _report._report_values(plan, indices, count, first, jnp))
    return bad


# -- 3. where a traced check may go ------------------------------------------------------------

_OUTSIDE = ("xgather", "jax", "jaxlib", "functools", "contextlib")


def _user_frame() -> tuple[types.FrameType | None, int]:
    """The first frame outside xgather and JAX, and its ``stacklevel`` from the caller."""
    frame: types.FrameType | None = sys._getframe(2)
    level = 2
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] in _OUTSIDE:
        frame, level = frame.f_back, level + 1
    return frame, level


def call_site() -> str:
    """``file:line`` of the user's code that called the op (at trace time), and the ONNX
    node it runs for, if any (``xgather._errors.NODE``: ``file:line|node``)."""
    frame, _ = _user_frame()
    site = "" if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno}"
    node = NODE.get()
    return f"{site}|{node}" if node else site


def traced(op: str) -> None:
    """Called where an ``"error"`` op traces its check: fails at trace time unless a
    ``checkify`` that keeps user checks ([`checked`][xgather.checked] is one) will functionalise it,
    and warns where JAX will drop it (a loop body inside a reverse-mode derivative)."""
    errors = _jaxprivate.checkify_errors()
    if errors is None and _patches.foreign():  # an exporter tracing, without xgather's plugin
        fail(op, 'mode="error" is traced under another library\'s patches of JAX, as an '
             f"exporter traces: {_patches.EXPORT_ADVICE}, which exports the check as "
             "onnxruntime's own; elsewhere, wrap the function in xgather.checked(f) or "
             "choose mode=\"clip\", \"fill\" or \"promise_in_bounds\"")
    if errors is None:  # no checkify is tracing
        fail(op, 'mode="error" checks indices at run time, which needs the traced function '
             "to be wrapped: use xgather.checked(f) as the outermost wrapper (or "
             "jax.experimental.checkify.checkify), or choose mode=\"clip\", \"fill\" or "
             "\"promise_in_bounds\"")
    if errors is not _jaxprivate.UNKNOWN and not checkify.user_checks <= errors:
        fail(op, 'mode="error" checks indices with checkify.check, which this '
             "checkify.checkify's errors set would drop: add checkify.user_checks to it "
             "(errors=checkify.float_checks | checkify.user_checks), or wrap with "
             "xgather.checked, or choose another mode",
             "errors=" + ", ".join(sorted(e.__name__ for e in errors)))
    if _jaxprivate.loop_inside_derivative():
        _, level = _user_frame()
        warnings.warn(UncheckedWarning(
            f"{op}: its mode=\"error\" check is traced in a lax.scan/map/fori_loop/"
            "while_loop body under a reverse-mode derivative, where JAX drops checkify "
            "checks: an out-of-range index would go unreported. Check the indices outside "
            "the loop, take the derivative inside the loop body, or choose mode=\"clip\", "
            "\"fill\" or \"promise_in_bounds\""), stacklevel=level)


#: The error set [`checked`][xgather.checked]'s own checkify runs with: user checks, as an
#: object of its own, so that a check knows its innermost checkify is checked's (and
#: sends the compact report, which only checked formats) and not a user's inside it.
CHECKED_ERRORS = frozenset(list(checkify.user_checks))  # a new object, equal in value

#: Whether [`checked`][xgather.checked] is tracing (``xgather._modes.TraceState``): part of
#: the trace context, so that a function jitted inside ``fn`` keeps the traces made there
#: (which hold functionalised checks) apart from those of a plain call, which gets
#: xgather's own error.
TRACING = TraceState("xgather_checked_tracing", ("no", "yes"), "no",
                     "Whether xgather.checked is tracing (set by xgather alone).")


def flag_set(flag) -> bool:
    """Whether the first value of a flag a program returned is set: a boolean (an eager
    call's) or ``_pack``'s integers, 0 or 1. Read on the host, it waits for the program. A
    single-device CPU array is read through the buffer protocol, the lowest byte of its
    first value (on a little-endian host), sooner than ``np.asarray``. Other arrays (GPU,
    sharded) are copied over."""
    if _LITTLE_ENDIAN:
        try:
            return memoryview(flag).cast("B")[0] != 0
        except (BufferError, TypeError, NotImplementedError):
            pass
    return bool(np.asarray(flag).ravel()[0])


_LITTLE_ENDIAN = sys.byteorder == "little"
