"""The bench's allocator setting: an explicit, opt-in fix for glibc's treatment of large
blocks, which ``xgather-bench`` applies before JAX starts (``--allocator``; the default on
a CPU), so that XLA's large outputs are timed without the page faults of fresh mappings.
It is the bench's, not the library's: xgather itself never changes malloc's settings.

glibc serves every block above its mmap threshold (at most 32 MiB) with a
fresh ``mmap`` and unmaps it on ``free``. XLA's CPU runtime allocates each
output afresh, so every call of a large gather page-faults its whole output
again (a 32 MiB output is 8193 faults a call); onnxruntime and OpenVINO keep
arenas and do not pay that. XLA runs programs on worker threads, and glibc
gives each worker thread its own arena, whose heaps are at most 64 MiB: a
block larger than that is mapped afresh there whatever the mmap settings, and
faulting it in can take longer than the computation.

:func:`keep_large_allocations` tells glibc, through ``mallopt``, to serve large blocks
from the heap, keep freed memory for reuse, and create no arenas beyond the main one.
The last part only reaches threads that have not yet allocated, so it must run before
JAX's first computation (before its CPU client starts its thread pool). The trade-off:
the process keeps the memory it has freed (its resident size stays at its high-water
mark) instead of returning it to the system, and all threads share one malloc lock.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import warnings

from xgather import _jaxprivate

M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_MAX = -4
M_ARENA_MAX = -8

_state = {"kept": False}


def keep_large_allocations() -> bool:
    """Serve large blocks from glibc's heap and keep freed memory. Idempotent.

    Call it first, before any JAX computation: XLA's worker threads that have
    already allocated keep their own arenas, where blocks over 64 MiB are still
    mapped afresh; a later call says so with a ``RuntimeWarning``.

    Returns True if glibc accepted the settings, False where there is no glibc
    (other C libraries, macOS, Windows): nothing changes there.
    """
    if _state["kept"]:
        return True
    if _backends_started():
        warnings.warn(
            "keep_large_allocations: called after JAX started its backends; XLA's "
            "worker threads keep their own malloc arenas, where blocks over 64 MiB "
            "are still mapped and page-faulted afresh on every call. Call it before "
            "the first JAX computation.", RuntimeWarning, stacklevel=2)
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = (mallopt(M_MMAP_MAX, 0) == 1
          and mallopt(M_TRIM_THRESHOLD, 2**31 - 1) == 1
          and mallopt(M_TOP_PAD, 64 << 20) == 1
          and mallopt(M_ARENA_MAX, 1) == 1)
    _state["kept"] = ok
    return ok


def _backends_started() -> bool:
    started = _jaxprivate.backends_started()
    if started is None:
        _jaxprivate.fallback("backends_are_initialized", "keep_large_allocations cannot "
                             "tell whether JAX's backends started before it")
        return False
    return started


def allocator_settings() -> dict:
    """What a benchmark record should say about the allocator."""
    import os
    return {"keep_large_allocations": _state["kept"],
            **{k: v for k, v in os.environ.items()
               if k.startswith(("MALLOC_", "GLIBC_TUNABLES", "LD_PRELOAD"))}}
