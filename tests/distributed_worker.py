"""One of the two JAX processes that tests/test_distributed.py starts on this machine.

Run as ``python -m tests.distributed_worker INPUTS OUTPUT PROCESS_ID PORT KIND`` from the
repository root, with ``JAX_PLATFORMS=cpu`` and
``XLA_FLAGS=--xla_force_host_platform_device_count=2``. It joins the coordinator on
``127.0.0.1:PORT`` (process 0 runs it) with gloo as the CPU collectives, builds a table
sharded by rows over the global mesh of both processes' devices, runs
``xgather.sharded.gather`` on the cases below and writes what it saw to ``OUTPUT`` (JSON):
each result's bits, gathered from both processes and per addressable shard, or the error
raised. It asserts nothing: the test compares with NumPy.

Importing this module (pytest's ``--doctest-modules`` does) runs nothing.
"""

from __future__ import annotations

import json
import os
import sys
import traceback


def _bits(x):
    """A float32 array's bit patterns, as a nested list (exact, NaN payloads included)."""
    import numpy as np
    return np.ascontiguousarray(x).view(np.uint32).tolist()


def _slices(index) -> list[list[int | None]]:
    return [[s.start, s.stop] for s in index]


def main(inputs: str, output: str, process_id: int, port: int, kind: str) -> None:
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                               process_id=process_id)

    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    import xgather

    given = np.load(inputs)
    table = given["table"]
    # The README's mesh (Explicit axes by default in jax 0.10 to 0.12), or an Auto one.
    if kind == "explicit":
        mesh = jax.make_mesh((jax.device_count(),), ("x",))
    else:
        mesh = jax.make_mesh((jax.device_count(),), ("x",), axis_types=(AxisType.Auto,))

    def global_array(x, spec):
        return jax.make_array_from_callback(x.shape, NamedSharding(mesh, spec), lambda i: x[i])

    data = global_array(table, P("x"))

    def sharded(i):
        return global_array(i, P("x"))

    def replicated(i):
        return global_array(i, P())

    def gather(batch, **kw):
        return lambda d, i: xgather.sharded.gather(d, i, mesh, "x", batch, **kw)

    def checked_async(batch):
        f = xgather.checked(jax.jit(gather(batch)))

        def call(d, i):
            out = f(d, i)
            xgather.raise_if_error()
            return out
        return call

    # name -> (function, indices in the inputs, how they are placed)
    cases = {
        "eager numpy, replicated": (gather(None), "good", np.asarray),
        "eager numpy, batch=x": (gather("x"), "good", np.asarray),
        "checked, device indices sharded, batch=x":
            (xgather.checked(jax.jit(gather("x")), sync=True), "good", sharded),
        "checked, device indices replicated":
            (xgather.checked(jax.jit(gather(None)), sync=True), "good", replicated),
        "jit, fill mode, batch=x": (jax.jit(gather("x", mode="fill", fill_value=-2.5)),
                                    "bad", sharded),
        "eager, clip mode, device indices sharded, batch=x":
            (gather("x", mode="clip"), "bad", sharded),
        "eager, device indices sharded, batch=x": (gather("x"), "good", sharded),
        "bad: eager, device indices sharded, batch=x": (gather("x"), "bad", sharded),
        "bad: eager numpy, batch=x": (gather("x"), "bad", np.asarray),
        "bad: checked, device indices sharded, batch=x":
            (xgather.checked(jax.jit(gather("x")), sync=True), "bad", sharded),
        "bad: checked (raise_if_error), device indices replicated":
            (checked_async(None), "bad", replicated),
        "after a failure: checked, device indices sharded, batch=x":
            (xgather.checked(jax.jit(gather("x")), sync=True), "good", sharded),
    }
    seen = {"process_index": jax.process_index(), "process_count": jax.process_count(),
            "device_count": jax.device_count(), "local_device_count": jax.local_device_count(),
            "collectives": jax.config.jax_cpu_collectives_implementation,
            "mesh_axis_types": [str(t) for t in mesh.axis_types],
            "data_shards": [_slices(s.index) for s in data.addressable_shards],
            "cases": {}}
    for name, (fn, which, place) in cases.items():
        try:
            out = fn(data, place(given[which]))
            result = {"global": _bits(multihost_utils.process_allgather(out, tiled=True)),
                      "shape": list(out.shape),
                      "shards": [{"index": _slices(s.index), "bits": _bits(s.data)}
                                 for s in out.addressable_shards]}
        except Exception as err:  # noqa: BLE001 - the test reads what was raised
            result = {"error": type(err).__name__, "message": str(err)}
        seen["cases"][name] = result
    with open(output, "w") as f:
        json.dump(seen, f)
    jax.distributed.shutdown()


if __name__ == "__main__":
    inputs, output, process_id, port, kind = sys.argv[1:]
    try:
        main(inputs, output, int(process_id), int(port), kind)
    except BaseException:
        # Exit now: the normal exit would wait for the other process at jax.distributed's
        # shutdown barrier (up to JAX's own timeouts, minutes); the test kills that one.
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
