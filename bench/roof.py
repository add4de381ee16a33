"""The memory-bandwidth roof: copy bandwidth measured in the same run.

Each library that runs on the device copies with its own kernel, and they differ: on an
H200, JAX's own pass (``x + 1``) moved 2973 GB/s where torch's ``copy_`` moved 4090 GB/s
and CuPy's ``copyto`` 4059 GB/s. The record keeps each by name (``"roof"``) and says
which one each "% of roof" figure divides by (``"pct_roof_of"``, :func:`basis`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import stats


def basis(device_roofs: dict[str, float], host_roofs: dict[str, float],
          platform: str) -> dict[str, str]:
    """Which copy the "% of roof" figures divide by: ``{"device": name, "host": name}``,
    the fastest copy on the device (for the systems there: JAX's, the GPU peers) and on
    the host (for the host peers). On a CPU, where the two are one, the fastest of all
    for both."""
    if platform == "cpu":
        both = {**device_roofs, **host_roofs}
        fastest = max(both, key=both.__getitem__)
        return {"device": fastest, "host": fastest}
    return {"device": max(device_roofs, key=device_roofs.__getitem__),
            "host": max(host_roofs, key=host_roofs.__getitem__)}


def jax_copy_gbps(device, nbytes: int, rounds: int = 7) -> float:
    """Read + write bandwidth of ``x + 1`` on ``device`` (a device-to-device pass XLA
    cannot elide)."""
    import jax
    x = jax.device_put(np.ones(nbytes // 4, np.float32), device)
    f = jax.jit(lambda a: a + 1)
    jax.block_until_ready(f(x))
    t = stats.median([stats.time_batch(lambda: jax.block_until_ready(f(x)), 3)
                      for _ in range(rounds)])
    return 2 * nbytes / t / 1e9


def numpy_copy_gbps(nbytes: int, threads: int, rounds: int = 7) -> float:
    """Read + write bandwidth of ``np.copyto`` split over ``threads`` threads."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    chunks = np.array_split(np.arange(src.size), threads)
    bounds = [(c[0], c[-1] + 1) for c in chunks if c.size]
    pool = ThreadPoolExecutor(threads) if threads > 1 else None

    def copy():
        if pool is None:
            np.copyto(dst, src)
        else:
            list(pool.map(lambda ab: np.copyto(dst[ab[0]:ab[1]], src[ab[0]:ab[1]]), bounds))

    copy()
    t = stats.median([stats.time_batch(copy, 3) for _ in range(rounds)])
    if pool:
        pool.shutdown()
    return 2 * nbytes / t / 1e9


def torch_cuda_copy_gbps(nbytes: int, rounds: int = 7) -> float:
    """Read + write bandwidth of ``dst.copy_(src)`` between two buffers on the GPU."""
    import torch
    src = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)

    def copy():
        dst.copy_(src)
        torch.cuda.synchronize()

    copy()
    t = stats.median([stats.time_batch(copy, 3) for _ in range(rounds)])
    return 2 * nbytes / t / 1e9


def cupy_copy_gbps(nbytes: int, rounds: int = 7) -> float:
    """Read + write bandwidth of ``cupy.copyto`` between two buffers on the GPU."""
    import cupy
    src = cupy.ones(nbytes // 4, dtype=cupy.float32)
    dst = cupy.empty_like(src)
    sync = cupy.cuda.Device().synchronize

    def copy():
        cupy.copyto(dst, src)
        sync()

    copy()
    t = stats.median([stats.time_batch(copy, 3) for _ in range(rounds)])
    return 2 * nbytes / t / 1e9
