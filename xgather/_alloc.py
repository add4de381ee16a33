"""An explicit, opt-in fix for glibc's treatment of large blocks.

glibc serves every block above its mmap threshold (at most 32 MiB) with a
fresh ``mmap`` and unmaps it on ``free``. XLA's CPU runtime allocates each
output afresh, so every call of a large gather page-faults its whole output
again (a 32 MiB output is 8193 faults a call); onnxruntime and OpenVINO keep
arenas and do not pay that. :func:`keep_large_allocations` tells glibc, through
``mallopt``, to serve large blocks from the heap and keep freed memory for
reuse. The trade-off: the process keeps the memory it has freed (its resident
size stays at its high-water mark) instead of returning it to the system.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_MAX = -4

_state = {"kept": False}


def keep_large_allocations() -> bool:
    """Serve large blocks from glibc's heap and keep freed memory. Idempotent.

    Returns True if glibc accepted the settings, False where there is no glibc
    (other C libraries, macOS, Windows): nothing changes there.
    """
    if _state["kept"]:
        return True
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = (mallopt(M_MMAP_MAX, 0) == 1
          and mallopt(M_TRIM_THRESHOLD, 2**31 - 1) == 1
          and mallopt(M_TOP_PAD, 64 << 20) == 1)
    _state["kept"] = ok
    return ok


def allocator_settings() -> dict:
    """What a benchmark record should say about the allocator."""
    import os
    return {"keep_large_allocations": _state["kept"],
            **{k: v for k, v in os.environ.items()
               if k.startswith(("MALLOC_", "GLIBC_TUNABLES", "LD_PRELOAD"))}}
