"""The workload table: W1-W10 and W9's variants, and the model steps M1-M4, each at
several sizes.

Sizes: ``quick``, ``default`` and ``large`` for a CPU; ``gpu`` for a GPU (tables of
1 GiB or more, and outputs of millions of elements, enough to fill an H100's 132
SMs); ``tiny`` for correctness tests.
"""

from __future__ import annotations

import dataclasses

import numpy as np

SIZES = ("quick", "default", "large", "gpu", "tiny")
HOT_ROWS = 32  # the rows that "repeated" indices are drawn from


@dataclasses.dataclass(frozen=True)
class Workload:
    """One gather problem.

    ``op`` names the spec op (``onnx.gather``, ``onnx.gather_nd``,
    ``onnx.gather_elements``, ``openvino.gather7``, or ``grad`` for the
    gradient of ``sum(onnx.gather(data, idx, 0) ** 2)``). ``dtype`` is the
    data's (``float32`` or ``bfloat16``); ``indices`` how they are drawn:
    ``uniform`` over the axis, ``repeated`` from :data:`HOT_ROWS` rows (a
    scatter-add then adds many values into each row), or ``unique`` (no row
    twice). ``cpu_default``: part of a plain run on a CPU. ``step``: for a model
    step, the computation around the gather (:mod:`bench.steps`); None for a gather
    alone.
    """

    key: str
    title: str
    op: str
    sizes: dict  # size name -> (data shape, indices shape)
    axis: int = 0
    batch_dims: int = 0
    dtype: str = "float32"
    indices: str = "uniform"
    cpu_default: bool = True
    step: str | None = None

    def shapes(self, size: str):
        return self.sizes[size]

    def np_dtype(self):
        if self.dtype == "bfloat16":
            import ml_dtypes  # installed with jax
            return np.dtype(ml_dtypes.bfloat16)
        return np.dtype(self.dtype)

    def arrays(self, size: str, seed: int = 0):
        """Data (:attr:`dtype`) and valid int64 indices for ``size``."""
        dshape, ishape = self.shapes(size)
        rng = np.random.default_rng(seed)
        data = rng.standard_normal(dshape, dtype=np.float32).astype(self.np_dtype(), copy=False)
        if self.op == "onnx.gather_nd":
            b, k = self.batch_dims, ishape[-1]
            cols = [rng.integers(0, dshape[b + j], ishape[:-1]) for j in range(k)]
            idx = np.stack(cols, -1)
        elif self.indices == "repeated":
            rows = dshape[self.axis]
            hot = rng.choice(rows, min(HOT_ROWS, rows), replace=False)
            idx = hot[rng.integers(0, hot.size, ishape)]
        elif self.indices == "unique":
            idx = rng.permutation(dshape[self.axis])[:int(np.prod(ishape))].reshape(ishape)
        else:
            idx = rng.integers(0, dshape[self.axis], ishape)
        return data, idx.astype(np.int64)

    def with_negatives(self, data_shape: tuple, idx: np.ndarray, seed: int = 1) -> np.ndarray:
        """``idx`` with a random half of its indices written as ``i - s`` (``s``: the size of
        the axis each addresses): legal negative indices, which count from the end, so the
        same values are gathered; a program that wraps them only when some index is
        negative takes that branch."""
        rng = np.random.default_rng(seed)
        flip = rng.random(idx.shape[:-1] if self.op == "onnx.gather_nd" else idx.shape) < 0.5
        if self.op == "onnx.gather_nd":
            b = self.batch_dims
            sizes = np.asarray(data_shape[b:b + idx.shape[-1]], idx.dtype)
            return np.where(flip[..., None], idx - sizes, idx)
        return np.where(flip, idx - data_shape[self.axis % len(data_shape)], idx)

    def warmup_arrays(self, size: str):
        """Arrays at the ``tiny`` shapes, or one row more where those are ``size``'s shapes."""
        data, idx = self.arrays("tiny")
        if self.shapes("tiny") == self.shapes(size):
            data = np.concatenate([data, data[:1]])
            idx = np.concatenate([idx, idx[:1]])
        return data, idx

    def gather_shape(self, dshape: tuple, ishape: tuple) -> tuple:
        """The gather's output shape for data of shape ``dshape`` and indices of shape
        ``ishape`` (for ``grad``, of the forward gather)."""
        dshape, ishape = tuple(dshape), tuple(ishape)
        if self.op == "onnx.gather_nd":
            b, k = self.batch_dims, ishape[-1]
            return ishape[:-1] + dshape[b + k:]
        if self.op == "onnx.gather_elements":
            return ishape
        a, b = self.axis % len(dshape), self.batch_dims
        return dshape[:a] + ishape[b:] + dshape[a + 1:]

    def output_elements(self, size: str) -> int:
        """Elements of the gather's output at ``size`` (for ``grad``, of the forward gather)."""
        return int(np.prod(self.gather_shape(*self.shapes(size))))

    def moved_bytes(self, size: str, index_bytes: int = 8) -> int:
        """Bytes a gather must move: the output read and written once, the indices read
        (``index_bytes`` each: 4 where JAX runs without x64). The gradient: that twice
        (the cotangent's rows read and added back), and the dense gradient written once.
        A model step: its gather's bytes (the step moves more, and computes)."""
        dshape, ishape = self.shapes(size)
        item = self.np_dtype().itemsize
        moved = 2 * self.output_elements(size) * item + int(np.prod(ishape)) * index_bytes
        if self.op == "grad":
            return 2 * moved + int(np.prod(dshape)) * item
        return moved


def _w(key, title, op, quick, default, large, gpu, tiny, **kw):
    return Workload(key, title, op, {"quick": quick, "default": default, "large": large,
                                     "gpu": gpu, "tiny": tiny}, **kw)


_EMB_GPU = ((1 << 21, 128), (1 << 18,))  # 2M rows x 128 f32: 1 GiB; 256K lookups
_GRAD = (((6250, 512), (1024,)), ((50000, 512), (8192,)), ((100000, 512), (16384,)))
_GRAD_BF16_GPU = ((1 << 22, 128), (1 << 18,))  # 1 GiB in bf16
_ELEMENTS = (((256, 1024), (256, 1024)), ((1024, 1024), (1024, 1024)),
             ((2048, 2048), (2048, 2048)), ((8192, 32768), (8192, 8192)), ((6, 9), (6, 9)))
_ND_BATCH = (((8, 2048, 256), (8, 512, 1)), ((64, 2048, 256), (64, 512, 1)),
             ((128, 2048, 256), (128, 512, 1)), ((128, 16384, 128), (128, 4096, 1)),
             ((3, 9, 4), (3, 5, 1)))

WORKLOADS = {w.key: w for w in [
    _w("W1", "embedding lookup", "onnx.gather",
       ((6250, 512), (1024,)), ((50000, 512), (8192,)), ((100000, 512), (16384,)),
       _EMB_GPU, ((50, 8), (13,))),
    _w("W2", "middle axis", "onnx.gather",
       ((8, 1024, 256), (300,)), ((64, 1024, 256), (300,)), ((128, 1024, 256), (300,)),
       ((256, 8192, 128), (2048,)), ((3, 10, 4), (7,)), axis=1),
    _w("W3", "last axis", "onnx.gather",
       ((512, 1024), (512,)), ((4096, 1024), (512,)), ((8192, 1024), (512,)),
       ((1 << 18, 1024), (512,)), ((5, 12), (6,)), axis=-1),
    _w("W4", "GatherND elements", "onnx.gather_nd",
       ((1024, 1024), (32768, 2)), ((1024, 1024), (262144, 2)), ((2048, 2048), (524288, 2)),
       ((16384, 16384), (1 << 22, 2)), ((9, 10), (17, 2))),
    _w("W5", "GatherND rows", "onnx.gather_nd",
       ((256, 256, 128), (2048, 2)), ((256, 256, 128), (16384, 2)),
       ((256, 256, 128), (32768, 2)), ((2048, 1024, 128), (1 << 18, 2)), ((4, 5, 3), (6, 2))),
    _w("W6", "GatherND batch_dims=1", "onnx.gather_nd", *_ND_BATCH, batch_dims=1),
    _w("W7", "OpenVINO Gather-7 batch_dims=1", "openvino.gather7",
       ((8, 4096, 128), (8, 1024)), ((64, 4096, 128), (64, 1024)),
       ((128, 4096, 128), (128, 1024)), ((128, 16384, 128), (128, 4096)),
       ((3, 11, 2), (3, 4)), axis=1, batch_dims=1),
    _w("W8", "tiny", "onnx.gather", ((100, 16), (10,)), ((100, 16), (10,)), ((100, 16), (10,)),
       ((100, 16), (10,)), ((100, 16), (10,))),
    _w("W9", "gradient of sum(gather ** 2)", "grad", *_GRAD, _EMB_GPU, ((50, 8), (13,))),
    _w("W10", "GatherElements", "onnx.gather_elements", *_ELEMENTS, axis=1),
    # Model steps (bench/steps.py): W1's, W10's and W6's gathers inside what a model
    # runs them in.
    _w("M1", "step: lookup, dense, relu, sum", "onnx.gather", *_GRAD, _EMB_GPU,
       ((50, 8), (13,)), step="dense"),
    _w("M2", "step: M1's gradient", "onnx.gather", *_GRAD, _EMB_GPU, ((50, 8), (13,)),
       step="dense_grad"),
    _w("M3", "step: GatherElements, softmax", "onnx.gather_elements", *_ELEMENTS,
       axis=1, step="softmax_matmul"),
    _w("M4", "step: GatherND, standardize", "onnx.gather_nd", *_ND_BATCH,
       batch_dims=1, step="standardize_matmul"),
    # W9's scatter-add under contention and without, in f32 and bf16 (some
    # jaxlib versions emit a compare-and-swap loop for it on NVIDIA GPUs). On a GPU
    # they are part of a plain run; on a CPU, only where --workloads names them.
    _w("W9r", f"grad, {HOT_ROWS} hot rows", "grad", *_GRAD, _EMB_GPU, ((50, 8), (13,)),
       indices="repeated", cpu_default=False),
    _w("W9u", "grad, no row twice", "grad", *_GRAD, _EMB_GPU, ((50, 8), (13,)),
       indices="unique", cpu_default=False),
    _w("W9r-bf16", f"grad, {HOT_ROWS} hot rows, bf16", "grad", *_GRAD, _GRAD_BF16_GPU,
       ((50, 8), (13,)), indices="repeated", dtype="bfloat16", cpu_default=False),
    _w("W9u-bf16", "grad, no row twice, bf16", "grad", *_GRAD, _GRAD_BF16_GPU,
       ((50, 8), (13,)), indices="unique", dtype="bfloat16", cpu_default=False),
]}


def default_keys(platform: str) -> list[str]:
    """The workloads of a plain run on ``platform`` (``cpu``, ``gpu``, ``tpu``)."""
    return [k for k, w in WORKLOADS.items() if platform != "cpu" or w.cpu_default]


def default_size(platform: str) -> str:
    """``gpu`` on a GPU; ``default`` elsewhere (the CPU sizes are launch-bound on a GPU)."""
    return "gpu" if platform == "gpu" else "default"
