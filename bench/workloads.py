"""The workload table: W1-W10, each at three sizes (quick, default, large)."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Workload:
    """One gather problem.

    ``op`` names the spec op (``onnx.gather``, ``onnx.gather_nd``,
    ``onnx.gather_elements``, ``openvino.gather7``, or ``grad`` for the
    gradient of ``sum(onnx.gather(data, idx, 0) ** 2)``).
    """

    key: str
    title: str
    op: str
    sizes: dict  # size name -> (data shape, indices shape)
    axis: int = 0
    batch_dims: int = 0

    def shapes(self, size: str):
        return self.sizes[size]

    def arrays(self, size: str, seed: int = 0):
        """Data (float32) and valid int64 indices for ``size``."""
        dshape, ishape = self.shapes(size)
        rng = np.random.default_rng(seed)
        data = rng.standard_normal(dshape, dtype=np.float32)
        if self.op == "onnx.gather_nd":
            b, k = self.batch_dims, ishape[-1]
            cols = [rng.integers(0, dshape[b + j], ishape[:-1]) for j in range(k)]
            idx = np.stack(cols, -1)
        else:
            idx = rng.integers(0, dshape[self.axis], ishape)
        return data, idx.astype(np.int64)

    def warmup_arrays(self, size: str):
        """Arrays at the ``tiny`` shapes, or one row more where those are ``size``'s shapes."""
        data, idx = self.arrays("tiny")
        if self.shapes("tiny") == self.shapes(size):
            data = np.concatenate([data, data[:1]])
            idx = np.concatenate([idx, idx[:1]])
        return data, idx

    def moved_bytes(self, size: str) -> int:
        """Bytes a gather must move: the output read and written once, the indices read."""
        dshape, ishape = self.shapes(size)
        if self.op == "onnx.gather_nd":
            b, k = self.batch_dims, ishape[-1]
            out = int(np.prod(ishape[:-1])) * int(np.prod(dshape[b + k:]))
        elif self.op == "onnx.gather_elements":
            out = int(np.prod(ishape))
        else:
            a, b = self.axis % len(dshape), self.batch_dims
            out = int(np.prod(dshape[:a])) * int(np.prod(ishape[b:])) * int(np.prod(dshape[a + 1:]))
        moved = 2 * out * 4 + int(np.prod(ishape)) * 8
        return 2 * moved if self.op == "grad" else moved


def _w(key, title, op, quick, default, large, tiny, **kw):
    return Workload(key, title, op, {"quick": quick, "default": default, "large": large,
                                     "tiny": tiny}, **kw)


WORKLOADS = {w.key: w for w in [
    _w("W1", "embedding lookup", "onnx.gather",
       ((6250, 512), (1024,)), ((50000, 512), (8192,)), ((100000, 512), (16384,)),
       ((50, 8), (13,))),
    _w("W2", "middle axis", "onnx.gather",
       ((8, 1024, 256), (300,)), ((64, 1024, 256), (300,)), ((128, 1024, 256), (300,)),
       ((3, 10, 4), (7,)), axis=1),
    _w("W3", "last axis", "onnx.gather",
       ((512, 1024), (512,)), ((4096, 1024), (512,)), ((8192, 1024), (512,)),
       ((5, 12), (6,)), axis=-1),
    _w("W4", "GatherND elements", "onnx.gather_nd",
       ((1024, 1024), (32768, 2)), ((1024, 1024), (262144, 2)), ((2048, 2048), (524288, 2)),
       ((9, 10), (17, 2))),
    _w("W5", "GatherND rows", "onnx.gather_nd",
       ((256, 256, 128), (2048, 2)), ((256, 256, 128), (16384, 2)),
       ((256, 256, 128), (32768, 2)), ((4, 5, 3), (6, 2))),
    _w("W6", "GatherND batch_dims=1", "onnx.gather_nd",
       ((8, 2048, 256), (8, 512, 1)), ((64, 2048, 256), (64, 512, 1)),
       ((128, 2048, 256), (128, 512, 1)), ((3, 9, 4), (3, 5, 1)), batch_dims=1),
    _w("W7", "OpenVINO Gather-7 batch_dims=1", "openvino.gather7",
       ((8, 4096, 128), (8, 1024)), ((64, 4096, 128), (64, 1024)),
       ((128, 4096, 128), (128, 1024)), ((3, 11, 2), (3, 4)), axis=1, batch_dims=1),
    _w("W8", "tiny", "onnx.gather", ((100, 16), (10,)), ((100, 16), (10,)), ((100, 16), (10,)),
       ((100, 16), (10,))),
    _w("W9", "gradient of sum(gather ** 2)", "grad",
       ((6250, 512), (1024,)), ((50000, 512), (8192,)), ((100000, 512), (16384,)),
       ((50, 8), (13,))),
    _w("W10", "GatherElements", "onnx.gather_elements",
       ((256, 1024), (256, 1024)), ((1024, 1024), (1024, 1024)), ((2048, 2048), (2048, 2048)),
       ((6, 9), (6, 9)), axis=1),
]}
