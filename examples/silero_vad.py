"""Run the silero-vad ONNX models with xgather's gathers, against onnxruntime.

silero-vad (a voice activity detector) ships small ONNX models whose graphs hold
Gather nodes (opsets 15 to 18, some inside If branches). This runs each one
through ``onnx.reference.ReferenceEvaluator(model, new_ops=xgather.onnx.reference_ops())``
on a few chunks of random audio, carrying the recurrent state from chunk to
chunk, and compares the speech probabilities and states with onnxruntime.

The silero-vad package depends on torch; only its .onnx files are needed here,
so fetch the wheel alone::

    pip download --no-deps silero-vad -d /tmp/silero-vad
    python examples/silero_vad.py /tmp/silero-vad/silero_vad-*.whl

The argument may also be a .onnx file or a folder of them; with no argument, an
installed silero-vad's data folder is used (found without importing torch).
Needs onnx and onnxruntime (``pip install -e '.[test]'``). Exits 1 on a mismatch.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import pathlib
import sys
import time
import warnings
import zipfile

import numpy as np

import xgather

GATHERS = ("Gather", "GatherND", "GatherElements")


def load_models(source: str | None) -> dict[str, bytes]:
    """The .onnx files of a silero-vad wheel, folder or file (or installed package), by name."""
    if source is None:
        spec = importlib.util.find_spec("silero_vad")  # locates it; runs no code of it
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit("silero-vad is not installed: pass a wheel, folder or .onnx file "
                             "(pip download --no-deps silero-vad -d DIR)")
        source = str(pathlib.Path(spec.submodule_search_locations[0]) / "data")
    path = pathlib.Path(source)
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as wheel:
            return {pathlib.PurePath(n).name: wheel.read(n) for n in sorted(wheel.namelist())
                    if n.endswith(".onnx")}
    files = sorted(path.glob("*.onnx")) if path.is_dir() else [path]
    return {f.name: f.read_bytes() for f in files}


def gather_nodes(graph, found=None) -> collections.Counter:
    """Gather nodes by op type, subgraphs (If branches) included."""
    found = collections.Counter() if found is None else found
    for node in graph.node:
        if node.op_type in GATHERS:
            found[node.op_type] += 1
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                gather_nodes(sub, found)
    return found


def feeds_for(model, audio: np.ndarray) -> dict[str, np.ndarray]:
    """Inputs for one chunk: ``input`` (1, n) audio, ``state`` zeros, ``sr`` 16000."""
    feeds = {}
    for inp in model.graph.input:
        dims = [d.dim_value for d in inp.type.tensor_type.shape.dim]
        if inp.name == "input":
            n = dims[-1] or audio.shape[-1]
            feeds["input"] = np.resize(audio, (1, n)).astype(np.float32)
        elif inp.name == "state":
            feeds["state"] = np.zeros((2, 1, 128), np.float32)
        elif inp.name == "sr":
            feeds["sr"] = np.array(16000, np.int64)
        else:
            raise ValueError(f"unexpected model input {inp.name!r}")
    return feeds


def compare(model_bytes: bytes, chunks: int = 3, seed: int = 0, rtol: float = 1e-4,
            atol: float = 1e-5) -> dict:
    """Run ``chunks`` chunks through the reference evaluator (xgather) and onnxruntime.

    Returns the largest absolute difference, the number of xgather gather calls,
    and the seconds each runtime took.
    """
    import onnx  # noqa: PLC0415
    import onnxruntime as ort  # noqa: PLC0415
    from onnx.reference import ReferenceEvaluator  # noqa: PLC0415

    model = onnx.load_from_string(model_bytes)
    calls = collections.Counter()
    names = {"Gather": "gather", "GatherND": "gather_nd", "GatherElements": "gather_elements"}

    def counting(op):  # xgather's OpRun class, counting the gathers it runs
        class Counted(op):
            def _run(self, *args, **kwargs):
                calls[names[op.__name__]] += 1
                return super()._run(*args, **kwargs)
        Counted.__name__ = Counted.__qualname__ = op.__name__
        return Counted

    options = ort.SessionOptions()
    options.log_severity_level = 3
    theirs = ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
    ours = ReferenceEvaluator(model, new_ops=[counting(op) for op in xgather.onnx.reference_ops()])
    rng = np.random.default_rng(seed)
    feeds = feeds_for(model, np.zeros(512, np.float32))
    worst, t_ours, t_theirs = 0.0, 0.0, 0.0
    for _ in range(chunks):
        feeds["input"] = (0.1 * rng.standard_normal(feeds["input"].shape)).astype(np.float32)
        t = time.perf_counter()
        want = theirs.run(None, feeds)
        t_theirs += time.perf_counter() - t
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # onnx's NumPy sigmoid overflows
            got = ours.run(None, feeds)
        t_ours += time.perf_counter() - t
        for g, w in zip(got, want, strict=True):
            if g.shape != w.shape or g.dtype != w.dtype:
                raise AssertionError(f"{g.dtype}{g.shape} vs onnxruntime's {w.dtype}{w.shape}")
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
            worst = max(worst, float(np.max(np.abs(g.astype(np.float64) - w))))
        if "state" in feeds:
            feeds["state"] = got[-1]  # carry the recurrent state on, as a stream would
    return {"max_abs_diff": worst, "gather_calls": dict(calls), "seconds_xgather": t_ours,
            "seconds_onnxruntime": t_theirs}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", nargs="?", help="a silero-vad wheel, folder or .onnx file")
    parser.add_argument("--chunks", type=int, default=3)
    args = parser.parse_args(argv)
    import onnx  # noqa: PLC0415

    ran = 0
    for name, data in load_models(args.source).items():
        found = gather_nodes(onnx.load_from_string(data).graph)
        if not found:
            print(f"{name}: no gather node, skipped")
            continue
        report = compare(data, args.chunks)
        print(f"{name}: gather nodes {dict(found)}; xgather calls {report['gather_calls']}; "
              f"max |diff| vs onnxruntime {report['max_abs_diff']:.2e}; "
              f"{report['seconds_xgather']:.2f} s (reference evaluator + xgather) vs "
              f"{report['seconds_onnxruntime']:.3f} s (onnxruntime)")
        if not report["gather_calls"]:
            print(f"{name}: xgather was never called", file=sys.stderr)
            return 1
        ran += 1
    return 0 if ran else 1


if __name__ == "__main__":
    sys.exit(main())
