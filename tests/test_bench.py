"""bench/: statistics, the record schema, compare, missing peers, one --quick run."""

from __future__ import annotations

import copy
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from xgather_bench import record, stats, systems
from xgather_bench.workloads import HOT_ROWS, WORKLOADS, default_keys, default_size


def test_statistics():
    assert stats.median([3.0, 1.0, 2.0]) == 2.0
    assert stats.spread([1.0, 1.0, 1.0, 1.0]) == 0.0
    assert stats.spread([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx((4.0 - 2.0) / 3.0)
    # the best (smallest) is not 1 here, so an identity would fail
    assert stats.ratios_to_best({"a": 6.0, "b": 3.0, "c": 12.0}) == {"a": 2.0, "b": 1.0,
                                                                   "c": 4.0}


def test_common_reps_are_equal_unless_a_system_is_slow():
    import time
    fns = {"fast": lambda: None, "also": lambda: None, "slow": lambda: time.sleep(0.02)}
    reps = stats.common_reps(fns, "fast", target_s=0.001, max_sample_s=0.03)
    assert reps["fast"] == reps["also"] > 1 and reps["slow"] == 1


def test_calibrate_reads_warm_batches_not_cold_first_calls():
    import time
    calls = []

    def fn():  # two cold calls (another system ran before), then 0.5 ms each
        calls.append(1)
        time.sleep(0.02 if len(calls) <= 2 else 0.0005)
    n = stats.calibrate(fn, target_s=0.01)
    assert 8 <= n <= 20, n  # 0.01 s over 0.5-1 ms calls; a cold call would set 1


def test_first_calls_are_cold_each_time_and_rotate_the_order():
    import time
    log, cache = [], set()

    def system(name, cold_s, warm_s):
        def fn():  # slow until it has run since the caches were last emptied
            log.append(name)
            time.sleep(warm_s if name in cache else cold_s)
            cache.add(name)
        return fn
    fns = {"a": system("a", 0.02, 0.0), "b": system("b", 0.01, 0.0),
           "peer": system("peer", 0.005, 0.005)}
    notes = []
    out = stats.first_calls(fns, {"a", "b"}, 3, cache.clear, notes.append)
    # each JAX system three times, each time cold; the peer once, in the first pass
    assert [len(out[k]) for k in ("a", "b", "peer")] == [3, 3, 1]
    assert min(out["a"]) >= 0.02 and min(out["b"]) >= 0.01
    assert notes == log[:7] == ["a", "b", "peer", "b", "a", "a", "b"]  # rotated each pass
    assert log[7:] == ["a", "b", "peer"] and cache == {"a", "b", "peer"}  # then each warm


def test_interleaved_rounds_visit_every_system_each_round():
    order = []
    fns = {k: (lambda k=k: order.append(k)) for k in "abcd"}
    samples = stats.interleaved(fns, rounds=12, reps=dict(a=1, b=2, c=1, d=1))
    rounds, pos = [], 0
    for _ in range(12):  # split the call log into rounds: b runs twice a sample
        n = 5
        rounds.append(order[pos:pos + n])
        pos += n
    assert pos == len(order)
    for r in rounds:
        assert sorted(set(r)) == list("abcd") and r.count("b") == 2
    firsts = {r[0] for r in rounds}
    predecessors_of_a = {r[r.index("a") - 1] for r in rounds if r.index("a")}
    assert len(firsts) > 1 and len(predecessors_of_a) > 1  # not one fixed order
    assert [len(v) for v in samples.values()] == [12] * 4


def test_paired_ratio_is_the_median_of_per_round_ratios():
    # A slow round (noise) hits both systems; the default is 2x promise in every
    # round but the last. The ratio of the medians (3 / 3) would say 1.
    default, promise = [2.0, 20.0, 3.0], [1.0, 10.0, 3.0]
    assert stats.paired_ratio(default, promise) == 2.0
    assert stats.median(default) / stats.median(promise) == 1.0
    assert stats.paired_spread([2.0, 4.0, 6.0], [1.0, 2.0, 3.0]) == 0.0
    with pytest.raises(ValueError, match="same number of rounds: 2, 3"):
        stats.paired_ratio([1.0, 2.0], [1.0, 2.0, 3.0])


def _res(w, s, samples, first=0.1):
    return {"workload": w, "title": "t", "system": s, "samples_s": samples,
            "median_s": stats.median(samples), "spread": 0.0, "gbps": 1.0, "pct_roof": 10.0,
            "ratio_to_best": 1.0, "first_call_s": first, "reps": 1}


def _record(schema=record.SCHEMA):
    results = [_res("W1", "xgather", [2e-3, 2e-3]), _res("W1", "lax", [1e-3, 1e-3])]
    rec = {"schema": schema, "date": "2026-11-22T00:00:00+00:00", "size": "quick",
           "device": {"kind": "cpu", "platform": "cpu", "backend": "cpu", "cores": 2},
           "roof": {"jax copy (cpu)": 10.0}, "versions": {}, "environment": {},
           "allocator": {}, "results": results}
    if schema != "xgather-bench/1":
        rec["check_cost"] = record.check_costs(results)
    return rec


def test_check_cost_pairs_default_and_promise_of_the_same_workload_and_setting():
    results = [_res("W1", "xgather", [3.0, 30.0, 2.0], first=0.5),
               _res("W1", "xgather[promise]", [1.0, 10.0, 2.0], first=0.1),
               _res("W2", "xgather @keep", [4.0, 4.0], first=0.3),
               _res("W2", "xgather[promise] @keep", [2.0, 1.0], first=0.3),
               _res("W2", "xgather[promise] @default", [8.0, 8.0]),
               _res("W3", "xgather", [1.0]), _res("W3", "lax", [1.0])]
    costs = {(c["workload"], c["system"]): c for c in record.check_costs(results)}
    assert set(costs) == {("W1", "xgather"), ("W2", "xgather @keep")}
    w1, w2 = costs["W1", "xgather"], costs["W2", "xgather @keep"]
    assert (w1["baseline"], w1["ratio"], w1["rounds"]) == ("xgather[promise]", 3.0, 3)
    assert w1["first_call_ratio"] == pytest.approx(5.0)
    assert (w2["baseline"], w2["ratio"], w2["first_call_ratio"]) == (
        "xgather[promise] @keep", 3.0, 1.0)
    # ratios 2 and 4: inclusive quartiles 2.5 and 3.5, median 3
    assert w2["spread"] == pytest.approx((3.5 - 2.5) / 3.0)


def test_check_cost_takes_the_rounds_of_the_pair_alone_where_the_run_has_them():
    d, p = _res("W1", "xgather", [9.0, 9.0, 9.0]), _res("W1", "xgather[promise]", [1.0, 1.0, 1.0])
    d["check_samples_s"], p["check_samples_s"] = [1.1, 2.4, 1.2], [1.0, 2.0, 1.0]
    (c,) = record.check_costs([d, p])
    assert (c["ratio"], c["rounds"], c["rounds_of"]) == (pytest.approx(1.2), 3, "the pair alone")
    del d["check_samples_s"]  # only one of the two: the main rounds
    (c,) = record.check_costs([d, p])
    assert (c["ratio"], c["rounds_of"]) == (9.0, "every system")


def test_schema_accepts_a_record_and_rejects_a_broken_one(tmp_path):
    rec = _record()
    rec["results"].append(_res("W1", "xgather[promise]", [1e-3, 5e-4], first=0.05))
    rec["check_cost"] = record.check_costs(rec["results"])
    assert [c["ratio"] for c in rec["check_cost"]] == [3.0]
    path = tmp_path / "r.json"
    record.save(rec, path)
    assert record.load(path) == rec
    broken = copy.deepcopy(rec)
    del broken["results"][0]["median_s"]
    with pytest.raises(ValueError, match=r"W1/xgather lacks \['median_s'\]"):
        record.validate(broken)
    with pytest.raises(ValueError, match="not an xgather-bench record"):
        record.validate({**rec, "schema": "other"})
    with pytest.raises(ValueError, match="record lacks 'roof'"):
        record.validate({k: v for k, v in rec.items() if k != "roof"})
    with pytest.raises(ValueError, match="record lacks 'check_cost'"):
        record.validate({k: v for k, v in rec.items() if k != "check_cost"})
    broken = copy.deepcopy(rec)
    del broken["check_cost"][0]["first_call_ratio"]
    with pytest.raises(ValueError, match=r"check_cost W1/xgather lacks \['first_call_ratio'\]"):
        record.validate(broken)


def test_a_version_1_record_still_loads_and_shows_its_check_cost(tmp_path):
    old = _record("xgather-bench/1")
    old["results"].append(_res("W1", "xgather[promise]", [1e-3, 1e-3]))
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    loaded = record.load(path)
    assert "check_cost" not in loaded
    text = record.table(loaded)
    (line,) = [ln for ln in text.splitlines()[text.splitlines().index(""):]
               if ln.startswith("W1")]
    assert line.split()[3:] == ["2.00", "0.0%", "1.00", "op", "alone"]
    assert "W1       xgather" in record.compare(loaded, _record())


def test_compare_gives_b_over_a():
    a, b = _record(), _record()
    b["results"][0]["median_s"] = 1e-3  # xgather twice as fast in B
    text = record.compare(a, b)
    lines = {ln.split()[1]: ln for ln in text.splitlines()[2:]}
    assert lines["xgather"].split()[-1] == "0.50"
    assert lines["lax"].split()[-1] == "1.00"
    b["results"] = [dict(b["results"][0], workload="W9")]
    assert "no workload/system pair in common" in record.compare(a, b)


def test_compare_shows_the_check_cost_of_both_records():
    a, b = _record(), _record()
    for rec, promise in ((a, [1e-3, 1e-3]), (b, [2e-3, 1e-3])):
        rec["results"].append(_res("W1", "xgather[promise]", promise))
        rec["check_cost"] = record.check_costs(rec["results"])
    text = record.compare(a, b)
    block = text.split("\n\n")[1].splitlines()
    assert block[-1].split() == ["W1", "xgather", "2.00", "1.50", "1.00", "1.00"]


# The copies of .ci/gpu's first run (an H200, bench.log), GB/s.
_H200_ROOF = {"jax copy (gpu)": 2972.7, "torch copy_ (cuda)": 4089.7,
              "cupy copyto (cuda)": 4058.9, "numpy copy 1t": 20.0, "numpy copy 16t": 86.9}


def test_roof_names_each_librarys_copy_and_the_one_pct_roof_divides_by():
    from xgather_bench import roof
    device = {k: v for k, v in _H200_ROOF.items() if not k.startswith("numpy")}
    host = {k: v for k, v in _H200_ROOF.items() if k.startswith("numpy")}
    assert roof.basis(device, host, "gpu") == {"device": "torch copy_ (cuda)",
                                               "host": "numpy copy 16t"}
    # on a CPU the device is the host: the fastest of all, whichever library's
    assert roof.basis({"jax copy (cpu)": 12.0}, {"numpy copy 1t": 8.0, "numpy copy 2t": 10.0},
                      "cpu") == {"device": "jax copy (cpu)", "host": "jax copy (cpu)"}
    rec = _record()
    rec["device"] = {"kind": "NVIDIA H200", "platform": "gpu", "backend": "gpu", "cores": 16,
                     "memory_bytes": None, "platform_version": None}
    rec["roof"], rec["pct_roof_of"] = _H200_ROOF, roof.basis(device, host, "gpu")
    for r in rec["results"]:
        r["pct_roof_of"] = "torch copy_ (cuda)"
    header = record.table(record.validate(rec)).splitlines()[0]
    assert header.endswith("; copy roof: jax copy (gpu) 2972.7 GB/s, torch copy_ (cuda) "
                           "4089.7 GB/s, cupy copyto (cuda) 4058.9 GB/s, numpy copy 1t 20.0 "
                           "GB/s, numpy copy 16t 86.9 GB/s; %roof divides by torch copy_ "
                           "(cuda) (device), numpy copy 16t (host)")
    # a record made before pct_roof_of: read as before
    del rec["pct_roof_of"]
    for r in rec["results"]:
        del r["pct_roof_of"]
    header = record.table(record.validate(rec)).splitlines()[0]
    assert header.endswith("numpy copy 16t 86.9 GB/s; %roof divides by the fastest copy of "
                           "its side")
    rec["pct_roof_of"] = {"device": "torch copy_", "host": "numpy copy 16t"}
    with pytest.raises(ValueError, match=r"pct_roof_of names copies the roof lacks: "
                                         r"\['torch copy_'\]"):
        record.validate(rec)


def test_a_gpu_is_expected_only_where_jax_platforms_leaves_it_a_choice(monkeypatch):
    """A CUDA plugin installed and JAX_PLATFORMS=cpu: the run is on the CPU, and the bench
    sets nothing for a GPU (XLA_PYTHON_CLIENT_PREALLOCATE)."""
    import argparse
    import importlib.util

    from xgather_bench import __main__ as cli
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "jax_cuda13_plugin"
                        else real(name, *a))
    args = argparse.Namespace(device=None)
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    assert cli._gpu_requested(args)  # the plugin, and nothing said: JAX takes the GPU
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert not cli._gpu_requested(args)
    monkeypatch.setenv("JAX_PLATFORMS", "cuda,cpu")
    assert cli._gpu_requested(args)
    assert not cli._gpu_requested(argparse.Namespace(device="cpu"))
    assert cli._gpu_requested(argparse.Namespace(device="gpu"))


def test_table_lists_every_result():
    text = record.table(_record())
    assert "W1 t" in text and text.count("\n") == 4  # header, columns, 2 results, the key
    assert text.splitlines()[-1].startswith("p90: the 90th percentile of the samples; "
                                            "spread: interquartile range / median")


def test_missing_peers_are_skipped():
    import jax
    w = WORKLOADS["W8"]
    data, idx = w.arrays("quick")
    device = jax.devices()[0]
    fns = systems.build(w, data, idx, device,
                        {"onnxruntime": False, "openvino": False, "torch": False}, None)
    host = {"numpy"} if device.platform == "cpu" else set()  # on a GPU: only where named
    assert set(fns) == {"xgather", "xgather[promise]", "lax", systems.JNP} | host


GATHERS = sorted(k for k, w in WORKLOADS.items() if w.step is None)
STEPS = sorted(k for k, w in WORKLOADS.items() if w.step is not None)


@pytest.mark.parametrize("key", GATHERS)
def test_every_system_computes_the_same_result(key):
    """The peers and the hand-written lax.gather agree with xgather on each workload."""
    import jax
    w = WORKLOADS[key]
    data, idx = w.arrays("tiny")
    named = {"xgather", systems.LINEAR, "lax", systems.JNP, "numpy", "onnxruntime", "openvino",
             "torch"}
    fns = systems.build(w, data, idx, jax.devices()[0], systems.available(), named)
    assert (systems.LINEAR in fns) == (key.startswith(("W4", "W10")))
    want = _as_f32(fns.pop("numpy")())
    tol = 1e-2 if w.dtype == "bfloat16" else 1e-5
    for name, fn in fns.items():
        out = fn()
        if name.startswith("onnxruntime"):
            out = out[0]
        elif name.startswith("openvino"):
            out = next(iter(out.values()))
        np.testing.assert_allclose(_as_f32(out), want, rtol=tol, atol=tol, err_msg=name)


def test_jnp_take_is_a_jax_system_of_every_plain_run():
    """JAX's own gather as a user writes it runs beside xgather and lax by default, in
    their block of rounds, on the device (GB/s with their index width)."""
    import jax
    assert systems.JNP == "jnp.take" and systems.JNP in systems.NAMES
    assert systems.library(systems.JNP) == "jax" == systems.library("lax")
    none = {"onnxruntime": False, "openvino": False, "torch": False}
    for key in ("W1", "M1"):
        w = WORKLOADS[key]
        built = systems.build(w, *w.arrays("tiny"), jax.devices()[0], none, None)
        assert systems.JNP in built
        assert set(systems.build(w, *w.arrays("tiny"), jax.devices()[0], none,
                                 {systems.JNP})) == {systems.JNP}
    assert systems.JNP not in systems.build(WORKLOADS["W1"], *WORKLOADS["W1"].arrays("tiny"),
                                            jax.devices()[0], none, {"lax"})


@pytest.mark.parametrize("size", ["tiny", "quick"])
@pytest.mark.parametrize("key", GATHERS)
def test_jnp_take_is_exact_on_every_gather(key, size):
    """``jnp.take``, ``jnp.take_along_axis`` and plain indexing give NumPy's values bit for
    bit (for the gradients, ``np.add.at``'s), as the hand-written lax.gather does."""
    import jax
    w = WORKLOADS[key]
    data, idx = w.arrays(size)
    fns = systems.build(w, data, idx, jax.devices()[0], {}, {systems.JNP, "lax", "numpy"})
    got = np.asarray(fns[systems.JNP]())
    assert got.dtype == data.dtype
    np.testing.assert_array_equal(_as_f32(got), _as_f32(fns["numpy"]()))
    np.testing.assert_array_equal(got, np.asarray(fns["lax"]()))


@pytest.mark.parametrize("key", STEPS)
def test_jnp_take_runs_the_model_step_as_lax_does(key):
    """A model step around ``jnp.take``'s gather gives what the same step around the
    hand-written lax.gather gives, bit for bit (and NumPy's step within rounding: the
    model-step test above)."""
    import jax
    w = WORKLOADS[key]
    for size in ("tiny", "quick"):
        data, idx = w.arrays(size)
        fns = systems.build(w, data, idx, jax.devices()[0], {}, {systems.JNP, "lax"})
        for g, x in zip(jax.tree.leaves(fns[systems.JNP]()), jax.tree.leaves(fns["lax"]()),
                        strict=True):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(x), err_msg=size)


def test_jnp_take_is_in_the_record_and_the_table(tmp_path):
    out = tmp_path / "run.json"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "xgather_bench", "--quick", "--workloads",
                           "W8", "--systems", "lax,jnp.take", "--repeats", "2", "--json",
                           str(out)], env=env, capture_output=True, text=True, check=True,
                          timeout=300)
    rec = record.load(out)
    assert sorted(r["system"] for r in rec["results"]) == ["jnp.take", "lax"]
    r = next(r for r in rec["results"] if r["system"] == systems.JNP)
    assert len(r["samples_s"]) == 2 and r["first_call_s"] > 0
    assert r["pct_roof_of"] == rec["pct_roof_of"]["device"]
    assert re.search(r"^(W8 tiny)?\s+jnp\.take\s+\d", proc.stdout, re.M), proc.stdout


@pytest.mark.parametrize("key", STEPS)
def test_every_system_runs_the_model_step_as_numpy_does(key):
    """A model step: xgather's default and promise, lax and torch agree with the step
    written in NumPy (bench/steps.py's numpy_step, float64 inside). torch runs it where
    the platform in use has it: on a CPU with its threads, on a GPU as torch-cuda."""
    import jax

    from xgather_bench import steps
    w = WORKLOADS[key]
    data, idx = w.arrays("tiny")
    want = steps.numpy_step(w, data, idx, steps.weights(w, data, idx))
    device = jax.devices()[0]
    peers = systems.available()
    names = {"xgather", "xgather[promise]", "lax", systems.JNP}
    if device.platform == "cpu" and peers["torch"]:
        names |= {f"torch {t}t" for t in sorted({1, systems.cores()})}
    if device.platform == "gpu":  # the GPU peers that run here; the host peers unnamed
        gpu_ok = {name: why is None for name, why in systems.gpu_peers().items()}
        peers = {**peers, **gpu_ok}
        names |= {"torch-cuda"} if gpu_ok["torch-cuda"] else set()
        # and promise with the linear lowering, where the gather is one of elements (M3's)
        names |= {systems.LINEAR} if systems.linear_applies(w, data, idx) else set()
    fns = systems.build(w, data, idx, device, peers, None)
    assert set(fns) == names  # no NumPy, onnxruntime, OpenVINO or CuPy step
    for name, fn in fns.items():
        # float32 matmuls in full precision (a GPU's default may be TF32): the
        # reference computes in float64
        with jax.default_matmul_precision("highest"):
            got = fn()
        pairs = zip(got, want, strict=True) if w.step == "dense_grad" else [(got, want)]
        for g, x in pairs:
            np.testing.assert_allclose(_as_f32(g), np.float32(x), rtol=2e-4, atol=2e-4,
                                       err_msg=name)


@pytest.mark.parametrize("key", STEPS)
def test_the_torch_cuda_model_step_code_agrees_with_numpy_on_the_cpu(key):
    """torch-cuda's model step (the code a GPU runs), on torch's CPU device."""
    if not systems.available()["torch"]:
        pytest.skip("torch is not installed")
    from xgather_bench import steps
    w = WORKLOADS[key]
    data, idx = w.arrays("tiny")
    want = steps.numpy_step(w, data, idx, steps.weights(w, data, idx))
    run = systems.torch_cuda_runner(w, data, idx, device="cpu")
    got = run()
    pairs = zip(got, want, strict=True) if w.step == "dense_grad" else [(got, want)]
    for g, x in pairs:
        np.testing.assert_allclose(_as_f32(g), np.float32(x), rtol=2e-4, atol=2e-4)
    if w.step == "dense_grad":  # a second call: the gradients do not accumulate
        for g, x in zip(run(), want, strict=True):
            np.testing.assert_allclose(_as_f32(g), np.float32(x), rtol=2e-4, atol=2e-4)
    assert systems.torch_cuda_runner(w, data, idx, embedding=True, device="cpu") is None


def test_m3s_weights_take_the_width_of_the_gather_not_of_the_data():
    """At GPU sizes M3 gathers rows of 8192 from rows of 32768: its matmul contracts the
    gathered rows' width (the shapes alone: a GPU size's arrays are not made here)."""
    from xgather_bench import steps
    m3, m1 = WORKLOADS["M3"], WORKLOADS["M1"]
    assert m3.shapes("gpu") == ((8192, 32768), (8192, 8192))
    assert steps.weight_shape(m3, *m3.shapes("gpu")) == (8192, steps.PROJECTION)
    assert steps.weight_shape(m1, *m1.shapes("gpu")) == (128, 128)
    data, idx = m3.arrays("tiny")
    wide = np.concatenate([data, data], axis=1)  # rows of 18, gathered rows of 9
    assert steps.weights(m3, wide, idx).shape == (9, steps.PROJECTION)
    out = steps.numpy_step(m3, wide, idx, steps.weights(m3, wide, idx))
    assert out.shape == (6, steps.PROJECTION)


def test_model_steps_name_their_gather_and_are_part_of_a_plain_cpu_run():
    assert STEPS == ["M1", "M2", "M3", "M4"]
    assert set(STEPS) <= set(default_keys("cpu"))
    assert {WORKLOADS[k].op for k in STEPS} == {"onnx.gather", "onnx.gather_elements",
                                                "onnx.gather_nd"}
    assert WORKLOADS["M1"].moved_bytes("default") == WORKLOADS["W1"].moved_bytes("default")


def test_by_library_times_each_library_alone_after_untimed_rounds():
    calls: list[str] = []

    def fn(name):
        return lambda: calls.append(name)
    names = ["xgather", "xgather[promise]", "lax", "torch 1t", "torch 2t", "numpy"]
    reps = {n: 1 for n in names} | {"torch 2t": 2}
    samples = stats.by_library({n: fn(n) for n in names}, reps, systems.library, least=4,
                               budget_s=0.0, most=4, warmup=2)
    assert list(samples) == names and all(len(v) == 4 for v in samples.values())
    libs = [systems.library(n) for n in calls]
    blocks = [k for k, _ in itertools.groupby(libs)]
    assert sorted(blocks) == ["jax", "numpy", "torch"]  # each library once, in one block
    # 2 untimed + 4 timed rounds; inside a block its systems take turns, round by round
    assert calls.count("lax") == 6 and calls.count("torch 2t") == 12
    jax_calls = [n for n in calls if systems.library(n) == "jax"]
    assert all(set(jax_calls[k:k + 3]) == {"xgather", "xgather[promise]", "lax"}
               for k in range(0, 18, 3))


def test_rounds_fit_the_budget_within_their_bounds():
    assert stats.rounds_for(0.01, 15, 1.0, 100) == 100  # short samples: the most
    assert stats.rounds_for(0.02, 15, 1.0, 100) == 50
    assert stats.rounds_for(0.25, 15, 1.0, 100) == 15  # long samples: the least
    assert stats.rounds_for(0.0, 7, 0.1, 30) == 30


def test_timed_rounds_are_set_by_the_longest_sample_after_untimed_rounds():
    import time
    calls: list[str] = []

    def fn(name, s):
        return lambda: (calls.append(name), time.sleep(s))
    fns = {"short": fn("short", 0.0), "long": fn("long", 0.004)}
    samples = stats.timed_rounds(fns, {"short": 1, "long": 2}, least=3, budget_s=0.1, most=50,
                                 warmup=2)
    n = len(samples["long"])
    assert n == len(samples["short"]) and 3 <= n <= 12  # 0.1 s over 8+ ms samples
    assert calls.count("long") == 2 * (2 + n)  # two untimed rounds first


def test_library_puts_the_jax_systems_together_and_drops_thread_counts():
    assert {systems.library(n) for n in ("xgather", "xgather[promise]", "lax")} == {"jax"}
    assert systems.library("onnxruntime 2t") == "onnxruntime" != systems.library("openvino 1t")
    assert systems.library("torch-cuda") == "torch-cuda" != systems.library("torch 1t")


def test_p90_shows_a_slow_mode_the_median_hides():
    xs = [1.0] * 8 + [3.0] * 2
    assert stats.median(xs) == 1.0 and stats.p90(xs) > 2.0
    assert stats.p90([2.0]) == 2.0


def _as_f32(out):
    """A system's output as a float32 NumPy array (torch's bfloat16 has no NumPy view)."""
    if type(out).__module__.startswith("torch"):
        out = out.float().cpu().numpy()
    elif type(out).__module__.startswith("cupy"):
        out = out.get()
    return np.asarray(out).astype(np.float32)


@pytest.mark.slow
def test_quick_run_end_to_end(tmp_path):
    out = tmp_path / "run.json"
    # The CPU main job, also where the suite runs on a GPU (.ci/gpu bench runs the GPU job).
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "xgather_bench", "--quick", "--repeats", "3",
                           "--json", str(out)], capture_output=True, text=True, env=env,
                          check=True, timeout=600)
    rec = record.load(out)
    assert {r["workload"] for r in rec["results"]} == set(default_keys("cpu"))
    assert {"xgather", "xgather[promise]", "lax", systems.JNP, "numpy"} <= {
        r["system"] for r in rec["results"]}
    assert all(len(r["samples_s"]) == 3 and r["median_s"] > 0 for r in rec["results"])
    assert rec["cpu_dispatch"] == "async" and rec["rounds"]["least"] == 3
    for r in rec["results"]:  # GB/s: the bytes each system's indices take, over its median
        jax32 = systems.library(r["system"]) == "jax" and not rec["x64"]
        moved = WORKLOADS[r["workload"]].moved_bytes("quick", 4 if jax32 else 8)
        assert r["gbps"] == pytest.approx(moved / r["median_s"] / 1e9, rel=1e-9)
    assert "W10 GatherElements" in proc.stdout
    for name, ok in systems.available().items():
        assert (f"skipping {name}" in proc.stderr) != ok
    cmp = subprocess.run([sys.executable, "-m", "xgather_bench", "compare", str(out), str(out)],
                         capture_output=True, text=True, check=True)
    medians, costs = cmp.stdout.split("\n\n")
    ratios = [ln.split()[-1] for ln in medians.splitlines()[2:]]
    assert ratios == ["1.00"] * len(rec["results"])
    assert {c["workload"] for c in rec["check_cost"]} == set(default_keys("cpu"))
    # Peers ran (numpy at least): the check cost comes from rounds of the pair alone.
    assert {c["rounds_of"] for c in rec["check_cost"]} == {"the pair alone"}
    assert all(len(r["check_samples_s"]) == 3 and len(r["pipelined_samples_s"]) == 3
               for r in rec["results"] if r["system"] in ("xgather", "xgather[promise]"))
    for c in rec["check_cost"]:  # pipelined: 10 calls, then one wait, in rounds of their own
        r = next(x for x in rec["results"]
                 if (x["workload"], x["system"]) == (c["workload"], c["system"]))
        b = next(x for x in rec["results"]
                 if (x["workload"], x["system"]) == (c["workload"], c["baseline"]))
        assert c["ratio_pipelined"] == pytest.approx(
            stats.paired_ratio(r["pipelined_samples_s"], b["pipelined_samples_s"]))
    assert not any("check_samples_s" in r for r in rec["results"]
                   if r["system"] not in ("xgather", "xgather[promise]"))
    assert "(rounds of the pair alone)" in proc.stdout
    assert all(r["p90_s"] >= r["median_s"] for r in rec["results"])
    assert {c["workload"]: c["context"] for c in rec["check_cost"]} == {
        k: "model step" if WORKLOADS[k].step else "op alone" for k in default_keys("cpu")}
    assert "M2 step: M1's gradient" in proc.stdout and " p90 ms " in proc.stdout
    assert len(costs.splitlines()) == 2 + len(default_keys("cpu"))
    assert "check cost: xgather (the spec's default) / xgather[promise]" in proc.stdout
    pytest.importorskip("matplotlib")
    png = tmp_path / "r.png"
    subprocess.run([sys.executable, "-m", "xgather_bench", "plot", str(out), "--out", str(png)],
                   check=True, capture_output=True)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    json.loads(out.read_text())


def test_collective_bytes_parses_compiled_hlo():
    from xgather_bench.sharded import collective_bytes
    hlo = ("%ag = s32[256]{0} all-gather(s32[32]{0} %p), dimensions={0}\n"
           "%rs = f32[32,64]{1,0} reduce-scatter(f32[256,64]{1,0} %x), dimensions={0}\n"
           "%ar-start = f32[4]{0} all-reduce-start(f32[4]{0} %y)\n")
    assert collective_bytes(hlo) == {"all-gather": 1024, "reduce-scatter": 8192, "all-reduce": 16}


@pytest.mark.slow
def test_sharded_bench_quick():
    proc = subprocess.run([sys.executable, "-m", "xgather_bench", "sharded", "--quick"],
                          capture_output=True, text=True, check=True, timeout=600,
                          env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"})
    lines = {ln.split("  ")[0].strip(): ln for ln in proc.stdout.splitlines()[2:]}
    assert set(lines) == {"xgather.sharded", "partitioner (xgather.onnx)",
                          "partitioner (jnp.take)"}
    assert "reduce-scatter" in lines["xgather.sharded"]


@pytest.mark.slow
def test_allocator_both_runs_each_setting_in_its_own_process(tmp_path):
    out = tmp_path / "both.json"
    subprocess.run([sys.executable, "-m", "xgather_bench", "--workloads", "W8", "--systems", "lax",
                    "--repeats", "2", "--allocator", "both", "--json", str(out)],
                   capture_output=True, text=True, check=True, timeout=600)
    rec = record.load(out)
    assert sorted(r["system"] for r in rec["results"]) == ["lax @default", "lax @keep"]
    assert min(r["ratio_to_best"] for r in rec["results"]) == 1.0
    # Each row's %roof follows from its own process's roof, which the record keeps
    for r in rec["results"]:
        setting = r["system"].split("@")[1]
        roof = max(v for k, v in rec["roof"].items() if k.endswith(f"@{setting}"))
        assert r["pct_roof"] == pytest.approx(100 * r["gbps"] / roof)
        assert rec["roof"][r["pct_roof_of"]] == roof and r["pct_roof_of"].endswith(setting)
    assert set(rec["pct_roof_of"]) == {f"{side} @{setting}" for side in ("device", "host")
                                       for setting in ("default", "keep")}
    assert rec["allocator"]["both"] and {"default", "keep"} <= set(rec["allocator"])
    assert "@default" in record.table(rec).splitlines()[2]


@pytest.mark.slow
def test_wheel_installs_the_bench_as_xgather_bench(tmp_path):
    """No top-level ``bench`` package in the wheel: it would shadow a user's own module."""
    import importlib.metadata
    import shutil
    import zipfile
    try:
        ok = int(importlib.metadata.version("setuptools").split(".")[0]) >= 68
    except importlib.metadata.PackageNotFoundError:
        ok = False
    if not ok:
        pytest.skip("needs setuptools>=68 in this environment (the build runs offline)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(os.path.join(root, "pyproject.toml"), src)
    shutil.copy(os.path.join(root, "README.md"), src)
    for d in ("xgather", "bench"):
        shutil.copytree(os.path.join(root, d), src / d,
                        ignore=shutil.ignore_patterns("__pycache__", "results"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp_path / "whl"), str(src)],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "whl").glob("xgather-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert "bench" not in top
    assert {"xgather", "xgather_bench"} <= top
    assert "xgather_bench/__main__.py" in names
    assert "xgather/py.typed" in names  # PEP 561: the annotations reach users
    (ep,) = [n for n in names if n.endswith("entry_points.txt")]
    assert "xgather-bench = xgather_bench.__main__:main" in zipfile.ZipFile(wheel).read(ep).decode()


def test_a_log_gets_one_progress_line_per_workload_and_no_fork_warning(tmp_path):
    """stderr piped (not a terminal): one line per workload, not one per round.

    openvino, where installed, is among the systems: its import starts a telemetry
    child process, which a fork-based start would make JAX warn about.
    """
    chosen = "xgather,lax" + (",openvino" if systems.available()["openvino"] else "")
    out = tmp_path / "run.json"
    # A run on the CPU, also on a machine with a GPU (whose suite runs with
    # XLA_PYTHON_CLIENT_PREALLOCATE set: not passed on, so that the record shows what
    # the bench itself sets for a CPU run, which is nothing).
    env = {k: v for k, v in os.environ.items() if k != "XLA_PYTHON_CLIENT_PREALLOCATE"}
    proc = subprocess.run([sys.executable, "-m", "xgather_bench", "--quick", "--workloads",
                           "W8,W3", "--systems", chosen, "--repeats", "3", "--no-table",
                           "--cpu-dispatch", "inline", "--json", str(out)],
                          env={**env, "JAX_PLATFORMS": "cpu"}, capture_output=True,
                          text=True, check=True, timeout=300)
    lines = proc.stderr.splitlines()
    assert "\r" not in proc.stderr
    assert [ln.split(":")[0] for ln in lines if ln.startswith("[")] == [
        "[1/2] W8 tiny", "[2/2] W3 last axis"]
    # the copies, each by name with its bandwidth, and the one %roof divides by
    (roof_line,) = [ln for ln in lines if ln.startswith("copy roof: ")]
    assert not any(re.search(r"round \d+/|first call of", ln) for ln in lines)
    assert "os.fork()" not in proc.stderr and "Warning" not in proc.stderr
    # the record of that run: schema 2, with the check cost and the new device fields
    rec = record.load(out)
    assert rec["schema"] == "xgather-bench/2"
    assert rec["cpu_dispatch"] == "inline"  # read back from JAX once its CPU client started
    assert [(c["workload"], c["rounds"]) for c in rec["check_cost"]] == [("W8", 3), ("W3", 3)]
    assert all(c["ratio"] > 0 and c["first_call_ratio"] > 0 for c in rec["check_cost"])
    assert rec["workloads"]["W3"] == {"data": [512, 1024], "indices": [512],
                                      "dtype": "float32", "indices_drawn": "uniform"}
    dev = rec["device"]
    assert "platform_version" in dev and dev["backend"] == dev["platform"] == "cpu"
    assert dev["memory_bytes"] is None  # a CPU device has no memory_stats
    assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in rec["environment"]  # set for a GPU only
    cores = systems.cores()
    names = ["jax copy (cpu)", "numpy copy 1t"] + ([f"numpy copy {cores}t"] if cores > 1 else [])
    assert list(rec["roof"]) == names
    fastest = max(rec["roof"], key=rec["roof"].get)  # on a CPU: the one roof for all
    assert rec["pct_roof_of"] == {"device": fastest, "host": fastest}
    for r in rec["results"]:
        assert r["pct_roof_of"] == fastest
        assert r["pct_roof"] == pytest.approx(100 * r["gbps"] / rec["roof"][fastest])
    assert roof_line == record.roof_line(rec["roof"], rec["pct_roof_of"])
    assert all(f"{k} {v:.1f} GB/s" in roof_line for k, v in rec["roof"].items())
    assert roof_line.endswith(f"; %roof divides by {fastest} (device and host)")


def test_plot_writes_a_png_with_log_ratio_axes(tmp_path):
    pytest.importorskip("matplotlib")
    rec = _record()
    rec["results"].append(_res("W1", "xgather[promise]", [1e-3, 1e-3], first=0.05))
    rec["results"].append(dict(_res("W8", "lax", [1e-3, 1e-3]), ratio_to_best=200.0))
    rec["check_cost"] = record.check_costs(rec["results"])
    fig = record.figure(rec)
    ratios, cost = fig.axes
    assert ratios.get_yscale() == "log" and cost.get_yscale() == "log"
    assert ratios.get_ylim()[1] >= 200.0  # W8's 200x is on the axis, not clipped
    heights = sorted(round(b.get_height(), 6) for b in cost.patches)
    assert heights == [2.0, 2.0]  # steady 2e-3/1e-3, first call 0.1/0.05
    png = tmp_path / "r.png"
    record.plot(rec, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lax_only = _record("xgather-bench/1")  # no promise: one panel
    assert [ax.get_yscale() for ax in record.figure(lax_only).axes] == ["log"]


def test_gpu_sizes_fill_an_h100_and_cpu_sizes_stay():
    sms, threads_per_sm = 132, 2048
    for key, w in WORKLOADS.items():
        if key == "W8":  # tiny by design: the dispatch floor
            assert w.shapes("gpu") == w.shapes("default")
            continue
        dshape, _ = w.shapes("gpu")
        assert int(np.prod(dshape)) * w.np_dtype().itemsize >= 2**30, key
        assert w.output_elements("gpu") >= sms * threads_per_sm, key
    assert default_size("gpu") == "gpu" and default_size("cpu") == "default"
    # the CPU sizes, as before
    assert WORKLOADS["W1"].shapes("default") == ((50000, 512), (8192,))
    assert WORKLOADS["W10"].shapes("quick") == ((256, 1024), (256, 1024))
    assert default_keys("cpu") == [f"W{i}" for i in range(1, 11)] + ["M1", "M2", "M3", "M4"]
    assert default_keys("gpu") == default_keys("cpu") + ["W9r", "W9u", "W9r-bf16", "W9u-bf16"]


def test_gradient_variants_draw_repeated_or_unique_rows():
    import ml_dtypes
    for key in ("W9r", "W9r-bf16"):
        data, idx = WORKLOADS[key].arrays("default")
        assert len(np.unique(idx)) == HOT_ROWS and idx.size == 8192
    for key in ("W9u", "W9u-bf16"):
        data, idx = WORKLOADS[key].arrays("default")
        assert len(np.unique(idx)) == idx.size == 8192
    assert WORKLOADS["W9r-bf16"].arrays("quick")[0].dtype == ml_dtypes.bfloat16
    assert WORKLOADS["W9r-bf16"].moved_bytes("quick") == \
        2 * (2 * 1024 * 512 * 2 + 1024 * 8) + 6250 * 512 * 2


def test_the_linear_element_lowering_runs_on_a_gpu_and_where_named(monkeypatch):
    import types
    none = {"onnxruntime": False, "openvino": False, "torch": False}
    monkeypatch.setattr(systems, "jax_inputs", lambda d, i, device: (d, i))
    cpu = types.SimpleNamespace(platform="cpu")
    for key in GATHERS:  # fake devices: no model step, whose weights go to the device
        w = WORKLOADS[key]
        elements = key.startswith(("W4", "W10"))
        arrays = w.arrays("tiny")
        assert (systems.LINEAR in systems.build(w, *arrays, _fake_gpu(), none, None)) == \
            elements, key
        assert systems.LINEAR not in systems.build(w, *arrays, cpu, none, None)
        assert (systems.LINEAR in systems.build(w, *arrays, cpu, none, {systems.LINEAR})) == \
            elements, key
    import jax
    for key in STEPS:
        w = WORKLOADS[key]
        built = systems.build(w, *w.arrays("tiny"), jax.devices()[0], none, {systems.LINEAR})
        assert (systems.LINEAR in built) == (key == "M3"), key


def _fake_gpu():
    import types
    return types.SimpleNamespace(platform="gpu")


def test_gpu_peers_are_skipped_with_a_reason_without_cuda():
    reasons = systems.gpu_peers()
    if not any(reasons.values()):
        pytest.skip("a GPU peer can run here")
    assert set(reasons) == set(systems.GPU_PEERS)
    for name, why in reasons.items():
        if why:
            assert re.search("cuda|cupy|not installed", why, re.I), (name, why)
    w = WORKLOADS["W1"]
    data, idx = w.arrays("tiny")
    ok = {name: why is None for name, why in reasons.items()}
    assert systems.build(w, data, idx, _fake_gpu(), ok, {"torch-cuda", "cupy"}).keys() <= {
        name for name, usable in ok.items() if usable}


def test_on_a_gpu_host_peers_run_only_where_named_and_on_a_cpu_no_gpu_peer():
    w = WORKLOADS["W1"]
    data, idx = w.arrays("tiny")
    none = {"onnxruntime": False, "openvino": False, "torch": False, "torch-cuda": False,
            "cupy": False}
    assert set(systems.build(w, data, idx, _fake_gpu(), none, {"numpy", "cupy"})) == {"numpy"}
    assert set(systems.build(w, data, idx, _fake_gpu(), none, {"torch-cuda"})) == set()
    import types
    cpu = types.SimpleNamespace(platform="cpu")
    claims = {**none, "torch-cuda": True, "cupy": True}  # ignored on a CPU device
    assert set(systems.build(w, data, idx, cpu, claims, {"numpy", "torch-cuda", "cupy"})) == {
        "numpy"}


def _gpu_device():
    import jax
    try:
        return jax.devices("gpu")[0]
    except RuntimeError:
        return None


@pytest.mark.skipif(not any(why is None for why in systems.gpu_peers().values()),
                    reason="needs torch with CUDA or CuPy on a GPU")
@pytest.mark.parametrize("key", GATHERS)
def test_gpu_peers_compute_the_same_result(key):
    """On a GPU: torch-cuda (both ways) and CuPy agree with NumPy on each workload."""
    w = WORKLOADS[key]
    data, idx = w.arrays("tiny")
    ok = {name: why is None for name, why in systems.gpu_peers().items()}
    device = _gpu_device() or _fake_gpu()
    fns = systems.build(w, data, idx, device, ok, {"numpy", *systems.GPU_PEERS})
    want = _as_f32(fns.pop("numpy")())
    assert fns, "no GPU peer ran"
    tol = 1e-2 if w.dtype == "bfloat16" else 1e-5
    for name, fn in fns.items():
        np.testing.assert_allclose(_as_f32(fn()), want, rtol=tol, atol=tol, err_msg=name)


def _numpy_as_cupy(monkeypatch):
    """NumPy standing in for CuPy, whose API is NumPy's (``take``, ``add.at``, ...), and a
    ``cupyx.scatter_add`` that warns as CuPy 14's does (it calls ``ndarray.scatter_add``,
    deprecated there: .ci/gpu's first run, tests.log)."""
    import types
    import warnings

    def scatter_add(a, slices, value):
        warnings.warn("`ndarray.scatter_add` is deprecated. Please use `cupy.add.at` "
                      "instead.", DeprecationWarning, stacklevel=2)
        np.add.at(a, slices, value)
    device = types.SimpleNamespace(synchronize=lambda: None)
    cupy = types.SimpleNamespace(
        asarray=np.asarray, take=np.take, take_along_axis=np.take_along_axis,
        zeros_like=np.zeros_like, arange=np.arange, add=np.add,
        cuda=types.SimpleNamespace(Device=lambda: device))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupyx", types.SimpleNamespace(scatter_add=scatter_add))


@pytest.mark.parametrize("key", GATHERS)
def test_the_cupy_peer_code_agrees_with_numpy_on_numpy(key, monkeypatch):
    """The CuPy peer's code on NumPy (no GPU or CuPy needed), without a deprecated call;
    the gradient against its closed form, 2 * data * (times each row is gathered)."""
    w = WORKLOADS[key]
    data, idx = w.arrays("tiny")
    _numpy_as_cupy(monkeypatch)
    run = systems.cupy_runner(w, data, idx)
    if w.dtype == "bfloat16":
        assert run is None  # CuPy has no bfloat16
        return
    if w.op == "grad":
        want = 2 * data * np.bincount(idx, minlength=data.shape[0])[:, None]
    else:
        want = systems.numpy_runner(w, data, idx)()
    np.testing.assert_allclose(run(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("key", GATHERS)
def test_the_torch_cuda_peer_code_agrees_with_numpy_on_the_cpu(key):
    """The torch-cuda peer's code, run on torch's CPU device (no GPU needed)."""
    if not systems.available()["torch"]:
        pytest.skip("torch is not installed")
    w = WORKLOADS[key]
    data, idx = w.arrays("tiny")
    want = _as_f32(systems.numpy_runner(w, data, idx)())
    tol = 1e-2 if w.dtype == "bfloat16" else 1e-5
    plain = systems.torch_cuda_runner(w, data, idx, device="cpu")
    np.testing.assert_allclose(_as_f32(plain()), want, rtol=tol, atol=tol)
    emb = systems.torch_cuda_runner(w, data, idx, embedding=True, device="cpu")
    assert (emb is not None) == (key in ("W1", "W8") or w.op == "grad")
    if emb is not None:
        np.testing.assert_allclose(_as_f32(emb()), want, rtol=tol, atol=tol)


def test_mistakes_are_one_line_errors_before_any_run(tmp_path):
    # Checked before the roof and the warm-up: exit code 2 and argparse's one-line message.
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    cut = tmp_path / "cut.json"
    cut.write_text('{"schema": ')
    cases = [(["--systems", "xgather,foo"], "unknown systems ['foo']"),
             (["--repeats", "1"], "needs 2 or more rounds"),
             (["--json", str(tmp_path / "no" / "run.json")], "no writable folder"),
             (["compare", str(tmp_path / "none.json"), str(listed)], "cannot read"),
             (["compare", str(listed), str(listed)], "not an xgather-bench record: a JSON list"),
             (["plot", str(cut), "--out", str(tmp_path / "x.png")], "not an xgather-bench record"),
             (["sharded", "--devices", "3"], "--devices must divide the table's 65536 rows"),
             (["eager", "--calls", "0"], "--calls must be 1 or more"),
             (["eager", "--repeats", "1"], "needs 2 or more rounds"),
             (["eager", "--json", str(tmp_path / "no" / "e.json")], "no writable folder")]
    for args, message in cases:
        proc = subprocess.run([sys.executable, "-m", "xgather_bench", *args],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, (args, proc.stderr[-500:])
        assert message in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr)


def _results_file(name: str) -> Path:
    """A record of bench/results/: from the repository checkout that holds this test, or
    beside the installed xgather_bench. An install (a wheel, pip install --target) has no
    results/: then the test skips, and says so."""
    for folder in (Path(__file__).resolve().parents[1] / "bench" / "results",
                   Path(record.__file__).parent / "results"):
        if (folder / name).is_file():
            return folder / name
    pytest.skip(f"bench/results/{name} is in the repository only: neither this checkout "
                f"({Path(__file__).resolve().parents[1]}) nor the installed xgather_bench "
                f"({Path(record.__file__).parent}) has it")


def test_compare_skips_workloads_that_ran_on_other_shapes():
    base = json.loads(_results_file("cpu-2core-2026-11-24-main-job.json").read_text())
    other = json.loads(json.dumps(base))
    other["size"] = "quick"
    other["workloads"]["W10"]["data"] = [256, 1024]
    text = record.compare(base, other)
    assert "the records differ in size (A default, B quick)" in text
    assert "not compared: W10 ran on other shapes (A ([1024, 1024]" in text
    medians = text.split("\n\n")[0]
    rows = [ln.split() for ln in medians.splitlines() if ln[:1] == "W" and ln[1].isdigit()]
    assert rows and all(r[-1] == "1.00" for r in rows) and not any(r[0] == "W10" for r in rows)


def _planned_ops():
    """``"module.name"`` of every public op the frontends define (those with a planner)."""
    import xgather
    return {f"{m.__name__.removeprefix('xgather.')}.{n}"
            for m in (xgather.onnx, xgather.openvino, xgather.bnns, xgather.labview)
            for n in dir(m) if not n.startswith("_")
            and hasattr(getattr(m, n), "__xgather_plan__")}


def test_the_eager_bench_times_every_op():
    from xgather_bench import eager
    assert set(eager.ops()) == _planned_ops()


def test_the_eager_bench_end_to_end(tmp_path, capsys):
    from xgather_bench import eager
    from xgather_bench.__main__ import main
    out = tmp_path / "eager.json"
    assert main(["eager", "--repeats", "2", "--calls", "3", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    rec = json.loads(out.read_text())
    import jax
    device = jax.devices()[0]  # the platform in use: cpu, or gpu under JAX_PLATFORMS=cuda
    assert rec["schema"] == eager.SCHEMA and rec["device"]["platform"] == device.platform
    assert rec["device"]["kind"] == device.device_kind
    assert rec["versions"]["jax"] and rec["calls_per_sample"] == 3
    assert set(rec["baseline"]) == {"device", "numpy"}
    assert {(r["op"], r["mode"], r["indices"]) for r in rec["results"]} == {
        (op, mode, where) for op in _planned_ops() for mode in ("promise_in_bounds", "default")
        for where in ("device", "numpy")}
    sections = text.split("\n\n")
    assert sections[1].startswith("device indices") and sections[2].startswith("numpy indices")
    for r in rec["results"]:
        base = rec["baseline"][r["indices"]]["samples_s"]
        assert len(r["samples_s"]) == 2 and r["median_s"] > 0
        assert r["ratio"] == pytest.approx(stats.paired_ratio(r["samples_s"], base))
        assert r["limit"] == ({"promise_in_bounds": 1.5, "default": 1.5}[r["mode"]]
                              if r["indices"] == "device" else None)
        section = sections[1 if r["indices"] == "device" else 2]
        row = next(ln for ln in section.splitlines() if ln.split()[:2] == [r["op"], r["mode"]])
        assert f"{r['ratio']:.2f}" in row.split()
    assert "baseline jnp.take(data, rows, axis=0)" in text
    for where, h in rec["hand_checked"].items():
        base = rec["baseline"][where]["samples_s"]
        assert h["ratio"] == pytest.approx(stats.paired_ratio(h["samples_s"], base))
        row = next(ln for ln in sections[1 if where == "device" else 2].splitlines()
                   if ln.startswith(eager.HAND))
        assert f"{h['ratio']:.2f}" in row.split()
    assert set(rec["hand_checked"]) == {"device", "numpy"}


def test_the_eager_bench_hand_written_check_gathers_by_the_spec_and_raises_at_the_call():
    import jax.numpy as jnp

    from xgather_bench import eager, systems
    call = eager.hand_checked()
    data = np.arange(20, dtype=np.float32).reshape(5, 4)
    rows = np.array([0, -1, 4, -5, 2], np.int32)
    for given in (rows, jnp.asarray(rows)):
        np.testing.assert_array_equal(np.asarray(call(jnp.asarray(data), given)),
                                      np.stack([data[k % 5] for k in rows]))
    for bad in ([5], [-6], [0, 7]):
        with pytest.raises(systems.OutOfRangeFlag, match=r"a row outside \[-5, 4\]"):
            call(jnp.asarray(data), np.array(bad, np.int32))


def test_the_crowding_bench_end_to_end(tmp_path, capsys):
    from xgather_bench import crowding
    from xgather_bench.__main__ import main
    out = tmp_path / "crowding.json"
    assert main(["crowding", "--quick", "--repeats", "2", "--peers", "numpy",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    rec = json.loads(out.read_text())
    assert rec["schema"] == crowding.SCHEMA and rec["workload"] == "W1"
    assert [r["peer"] for r in rec["rows"]] == [None, "numpy"]
    for row in rec["rows"]:
        ref = row["samples_s"]["xgather[promise]"]
        assert {"xgather", "lax", "flag + gather"} <= set(row["samples_s"])
        assert ("numpy" in row["samples_s"]) == (row["peer"] == "numpy")
        for name, ratio in row["ratios"].items():
            assert ratio == pytest.approx(stats.paired_ratio(row["samples_s"][name], ref))
        line = next(ln for ln in text.splitlines() if ln.startswith(row["peer"] or "(none)"))
        assert f"{row['ratios']['flag + gather']:.2f}" in line


def test_the_crowding_bench_plain_program_is_the_spec_gather_and_its_flag():
    import jax.numpy as jnp

    from xgather_bench import crowding
    data = np.arange(20, dtype=np.float32).reshape(5, 4)
    for idx, bad in (([0, -1, 4, -5], False), ([1, 5], True), ([-6, 2], True)):
        flag, got = crowding.plain_runner(jnp.asarray(data), jnp.asarray(idx, np.int32))()
        assert bool(flag) == bad
        if not bad:  # rows by the spec's rule: negative counts from the end
            np.testing.assert_array_equal(got, np.stack([data[k % 5] for k in idx]))


def test_inline_dispatch_is_refused_once_jax_has_started(capsys):
    import jax
    jax.devices()  # this process's CPU client has started
    from xgather_bench.__main__ import main
    with pytest.raises(SystemExit, match="before JAX starts its CPU client"):
        main(["crowding", "--quick", "--repeats", "2", "--peers", "numpy",
              "--cpu-dispatch", "inline"])
    assert jax.config.read("jax_cpu_enable_async_dispatch")


def test_the_crowding_bench_refuses_unknown_peers(capsys):
    from xgather_bench.__main__ import main
    with pytest.raises(SystemExit):
        main(["crowding", "--peers", "tensorflow"])
    assert "unknown peers ['tensorflow']" in capsys.readouterr().err


def test_the_eager_bench_checks_each_result_before_timing(monkeypatch):
    """An op that gathers the wrong rows stops the run: a timing of a wrong result is no
    result."""
    import xgather
    from xgather_bench import eager
    real = eager.ops()

    def shifted(data, indices, axis, **kw):
        return xgather.onnx.gather(data, (indices + 1) % eager.ROWS, axis, **kw)
    monkeypatch.setattr(eager, "ops", lambda: {**real, "onnx.gather": (shifted, "rows",
                                                                       {"axis": 0})})
    with pytest.raises(AssertionError, match="onnx.gather promise_in_bounds device"):
        eager.run(repeats=2, calls=1)


def test_the_check_bench_end_to_end(tmp_path, capsys):
    """xgather-bench check: promise, the deferred default and sync=True, each blocked and
    pipelined in shared rounds; ratios are paired; a pipelined sample is per call."""
    from xgather_bench import check
    from xgather_bench.__main__ import main
    out = tmp_path / "check.json"
    assert main(["check", "--quick", "--repeats", "2", "--workloads", "W8,W7,M1",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    rec = json.loads(out.read_text())
    assert rec["schema"] == check.SCHEMA and rec["pipeline"] == check.PIPELINE == 10
    assert isinstance(rec["allocator"]["keep_large_allocations"], bool)  # False: JAX ran
    assert [r["workload"] for r in rec["results"]] == ["W8", "W7", "M1"]
    for r in rec["results"]:
        assert r["checked"] == (r["workload"] != "W7")  # OpenVINO's default fills
        # the hand-written check beside the modes, where the default checks
        modes = (*check.MODES, check.LAX_CHECKED) if r["checked"] else check.MODES
        assert set(r["samples_s"]) == {f"{m} {s}" for m in modes
                                       for s in ("blocked", "pipelined")} and r["rounds"] == 2
        for shape in ("blocked", "pipelined"):
            for mode in ("default", "sync"):
                assert r[f"{mode}/promise {shape}"] == pytest.approx(stats.paired_ratio(
                    r["samples_s"][f"{mode} {shape}"], r["samples_s"][f"promise {shape}"]))
        assert set(r["host_call_s"]) == set(r["first_call_s"]) == set(modes)
        for shape in ("blocked", "pipelined") if r["checked"] else ():
            assert r[f"default/lax-checked {shape}"] == pytest.approx(stats.paired_ratio(
                r["samples_s"][f"default {shape}"], r["samples_s"][f"lax-checked {shape}"]))
        assert r["host_split_s"]["dispatch"] == r["host_call_s"]["default"]
        assert r["host_split_s"]["flag_read"] == pytest.approx(
            max(0.0, r["host_call_s"]["sync"] - r["host_call_s"]["default"]))
        assert r["first_call_ratio"] == pytest.approx(r["first_call_s"]["default"]
                                                      / r["first_call_s"]["promise"])
        row = next(ln for ln in text.splitlines() if ln.startswith(r["workload"] + " "))
        assert f"{r['default/promise pipelined']:.2f}" in row.split()
    assert "pipelined = 10 calls then one wait" in text
    assert rec["lax_checked_limit"] == check.LAX_CHECKED_LIMIT == 1.10
    assert re.search(r"def/lax-checked blk +def/lax-checked pip", text)
    pieces = rec["pieces_us"]  # a deferred call's pieces, each timed, each in the table
    assert set(pieces) == {"call, one output", "call, a flag beside",
                           "flag.copy_to_host_async()", "flag.is_ready()", "read a copied flag",
                           "read a flag, no copy first", "read a group, per call"}
    assert all(0 < v < 1e5 for v in pieces.values())
    assert all(f"{k} {v:.1f}" in text for k, v in pieces.items())


# -- .ci/gpu wrap: the negative wrap branched and fused; .ci/gpu readers: the flag readers --

WRAPS = (systems.BRANCHED_WRAP, systems.FUSED_WRAP)


def test_the_wrap_systems_run_only_where_named_and_promise_alone_may_be_named():
    import jax
    assert set(WRAPS) | {systems.PROMISE} <= set(systems.NAMES)
    assert systems.WRAP_SYSTEMS == {systems.BRANCHED_WRAP: "by_size", systems.FUSED_WRAP: "fused"}
    w = WORKLOADS["W4"]
    data, idx = w.arrays("tiny")
    none = {"onnxruntime": False, "openvino": False, "torch": False}
    device = jax.devices()[0]
    plain = systems.build(w, data, idx, device, none, None)
    assert not any(name.startswith(WRAPS) for name in plain)
    assert set(systems.build(w, data, idx, device, none, {systems.PROMISE})) == {systems.PROMISE}
    assert set(systems.build(w, data, idx, device, none, set(WRAPS))) == {
        name + suffix for name in WRAPS for suffix in ("", systems.NEG)}


def test_negative_indices_are_legal_and_gather_the_same_values():
    for key in ("W4", "W10", "W1", "W6"):
        w = WORKLOADS[key]
        data, idx = w.arrays("quick")
        neg = w.with_negatives(data.shape, idx)
        assert neg.shape == idx.shape and neg.dtype == idx.dtype
        assert 0.4 < np.mean(neg < 0) < 0.6 and (neg >= -np.max(data.shape)).all(), key
        if w.op == "onnx.gather_nd":  # a tuple's components negative together
            assert ((neg < 0).any(axis=-1) == (neg < 0).all(axis=-1)).all()
        np.testing.assert_array_equal(systems.numpy_runner(w, data, neg)(),
                                      systems.numpy_runner(w, data, idx)(), err_msg=key)


@pytest.mark.parametrize("key", ["W4", "W10"])
def test_the_branched_wrap_takes_its_branch_the_fused_does_not_and_both_equal_numpy(key):
    """At quick sizes (the branch's sizes, as at the GPU's): the branched system's program
    holds a conditional, the fused one's none; each equals NumPy's gather, on the
    workload's indices and with half of them negative."""
    import jax

    import xgather
    w = WORKLOADS[key]
    data, idx = w.arrays("quick")
    fns = systems.build(w, data, idx, jax.devices()[0], {}, {*WRAPS, "numpy"})
    want = fns.pop("numpy")()
    assert set(fns) == {name + suffix for name in WRAPS for suffix in ("", systems.NEG)}
    for name, fn in fns.items():
        wrap = systems.WRAP_SYSTEMS[name.removesuffix(systems.NEG)]
        assert fn.lowering == {"wrap": wrap, "wrap_pass": "gather" if wrap == "by_size"
                               else "fused", "branch": wrap == "by_size",
                               "indices": "half negative" if name.endswith(systems.NEG)
                               else "the workload's"}, name
        np.testing.assert_array_equal(np.asarray(fn()), want, err_msg=name)
    # the same, seen from outside: the lowered text and the plan inside the block
    d, i = systems.jax_inputs(data, idx, jax.devices()[0])
    op, attrs, options = systems.xgather_op(w)
    for wrap, branch in (("by_size", True), ("fused", False)):
        text = jax.jit(systems._lowered_fn(w, "promise_in_bounds", {"wrap": wrap})).lower(
            d, i).as_text()
        assert ("stablehlo.case" in text) == branch, wrap
        with xgather.lowering(wrap=wrap):
            plan = xgather.explain(op, d, i, *attrs, mode="promise_in_bounds", **options)
        assert plan.wrap_pass == ("gather" if branch else "fused") and plan.negative


def test_a_lowering_holds_in_every_trace_also_after_clear_caches(monkeypatch):
    """The first-call timings empty JAX's caches before each first call: the trace that
    follows takes the system's lowering too (xgather[branched-wrap], xgather[linear])."""
    import jax

    from xgather import _lower
    w = WORKLOADS["W10"]
    data, idx = w.arrays("tiny")
    fns = systems.build(w, data, idx, jax.devices()[0], {},
                        {systems.BRANCHED_WRAP, systems.LINEAR})
    choices, seen = _lower.choices, []
    monkeypatch.setattr(_lower, "choices", lambda p=None: seen.append(choices(p)) or choices(p))
    for name, field, want in ((systems.BRANCHED_WRAP, "wrap", "by_size"),
                              (systems.LINEAR, "element_gather", "linear")):
        for _ in range(2):
            jax.clear_caches()
            seen.clear()
            fns[name]()
            assert seen and {getattr(c, field) for c in seen} == {want}, (name, seen)


def test_a_wrap_system_whose_program_is_not_what_it_asks_is_refused(monkeypatch):
    import jax

    import xgather
    w = WORKLOADS["W10"]
    data, idx = w.arrays("quick")
    d, i = systems.jax_inputs(data, idx, jax.devices()[0])
    monkeypatch.setattr(systems, "_lowered_fn",
                        lambda w, mode, lowering=None, **kw: systems._xgather_fn(w, mode, **kw))
    # traced with a CPU's choices on every machine: the branch, whatever wrap is asked
    with xgather.lowering("cpu"):
        systems.wrap_program(w, d, i, "by_size")
        with pytest.raises(RuntimeError, match="wrap='fused'.*a conditional"):
            systems.wrap_program(w, d, i, "fused")
    # and a GPU's: no branch, where "by_size" asks for one at these shapes
    with xgather.lowering("gpu"), pytest.raises(RuntimeError,
                                                match="wrap='by_size'.*no conditional"):
        systems.wrap_program(w, d, i, "by_size")


def test_each_flag_reader_reads_its_group_size_and_equals_numpy():
    """Per-flag reads (READ_GROUP 1): every call's flag closed by itself; groups of 8: one
    read of 8 calls and one of the 2 left; promise: none. The results equal NumPy's, and
    READ_GROUP is the library's again after each."""
    import jax

    import xgather
    from xgather import _checked
    from xgather_bench import check, readers, steps
    assert readers.READERS == {"promise": None, "per-flag": 1, "groups of 8": 8}
    for key in ("W1",):
        w = WORKLOADS[key]
        data, idx = w.arrays("tiny")
        with readers.flags_as_accelerators("cpu"):
            fns = check._functions(w, *check._inputs(w, data, idx, jax.devices()[0]))
            want = (np.take(data, idx, axis=w.axis) if w.step is None else
                    steps.numpy_step(w, data, idx, steps.weights(w, data, idx)))
            for name, group in readers.READERS.items():
                f = fns["promise" if group is None else "default"]
                sizes = readers.groups_read(f, group)
                assert sizes == {None: [], 1: [1] * 10, 8: [8, 2]}[group], (key, name)
                assert _checked.READ_GROUP == 8
                with readers.reader(group), jax.default_matmul_precision("highest"):
                    got = f()
                    assert _checked.READ_GROUP == (group or 8)
                    xgather.raise_if_error()
                np.testing.assert_allclose(np.asarray(got, np.float32), np.float32(want),
                                           rtol=2e-4, atol=2e-4, err_msg=f"{key} {name}")
    assert _checked._on_host is not None and _checked.READ_GROUP == 8


def test_a_bad_index_is_still_raised_with_flags_read_one_by_one():
    import jax

    import xgather
    from xgather_bench import readers
    f = xgather.checked(jax.jit(lambda d, i: xgather.onnx.gather(d, i)))
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    with readers.flags_as_accelerators("cpu"), readers.reader(1):
        with pytest.raises(xgather.OutOfBoundsError, match=r"index 7 [^\n]*\n.*call 3 of"):
            for n in range(5):  # raised at a later call, or at raise_if_error
                f(data, np.array([7 if n == 2 else 0]))
            xgather.raise_if_error()
        xgather.raise_if_error()  # once


def test_the_readers_bench_end_to_end(tmp_path, capsys):
    import jax

    from xgather_bench import readers
    from xgather_bench.__main__ import main
    out = tmp_path / "readers.json"
    assert main(["readers", "--quick", "--repeats", "2", "--workloads", "W8,W7",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    rec = json.loads(out.read_text())
    assert rec["schema"] == readers.SCHEMA and rec["pipeline"] == readers.PIPELINE == 10
    # a CPU's flags are read as an accelerator's would be; an accelerator's are its own
    assert rec["flags_taken_as_accelerators"] is (jax.default_backend() == "cpu")
    [r] = rec["results"]  # W7: OpenVINO's default fills, no flag to read
    assert r["workload"] == "W8" and r["rounds"] == 2
    assert r["groups_read"] == {"promise": [], "per-flag": [1] * 10, "groups of 8": [8, 2]}
    assert set(r["samples_s"]) == set(r["host_call_s"]) == set(readers.READERS)
    assert r["per-flag/groups of 8"] == pytest.approx(stats.paired_ratio(
        r["samples_s"]["per-flag"], r["samples_s"]["groups of 8"]))
    row = next(ln for ln in text.splitlines() if ln.startswith("W8 "))
    assert f"{r['per-flag/promise']:.2f}" in row.split()


def test_the_table_shows_where_each_wrap_runs_blocked_and_pipelined():
    rec = _record()
    promise = _res("W4", "xgather[promise]", [1e-3, 1e-3])
    branched = _res("W4", "xgather[branched-wrap] neg", [3e-3, 3e-3])
    promise["wrap_pipelined_samples_s"] = [5e-4, 5e-4]
    branched["wrap_pipelined_samples_s"] = [2e-3, 2e-3]
    branched["lowering"] = {"wrap": "by_size", "wrap_pass": "gather", "branch": True,
                            "indices": "half negative"}
    rec["results"] += [promise, branched]
    text = record.table(record.validate(rec))
    assert "the negative wrap: where each program wraps" in text
    assert re.search(r"xgather\[promise\] +1\.000 +0\.500  none \(negative_indices=False\)",
                     text)
    assert re.search(r"xgather\[branched-wrap\] neg +3\.000 +2\.000  gather \(a branch\), "
                     r"half negative indices", text)


# -- lax-checked: the hand-written check, the floor of one that returns a flag --------------

#: W1-W10 where xgather's default checks (W9's variants: W9's program on other indices).
CHECKED_GATHERS = [k for k, w in WORKLOADS.items()
                   if re.fullmatch(r"W\d+", k) and systems.checks(w, None)]


def test_lax_checked_runs_where_the_default_checks_and_only_where_named():
    import jax
    device = jax.devices()[0]
    assert CHECKED_GATHERS == ["W1", "W2", "W3", "W4", "W5", "W6", "W8", "W9", "W10"]
    assert systems.LAX_CHECKED in systems.NAMES
    assert systems.library(systems.LAX_CHECKED) == "jax"
    for key in ("W1", "W7"):
        w = WORKLOADS[key]
        data, idx = w.arrays("tiny")
        plain = systems.build(w, data, idx, device, {}, None)
        assert systems.LAX_CHECKED not in plain and "lax" in plain
        named = systems.build(w, data, idx, device, {}, {systems.LAX_CHECKED})
        assert set(named) == ({systems.LAX_CHECKED} if key == "W1" else set()), key


@pytest.mark.parametrize("key", CHECKED_GATHERS)
def test_lax_checked_equals_numpy_and_its_flag_is_false(key):
    """On the workload's quick arrays: lax-checked's result is NumPy's gather and its
    flag False; with half of the indices negative (legal, wrapped), the same."""
    import jax
    w = WORKLOADS[key]
    data, idx = w.arrays("quick")
    device = jax.devices()[0]
    fns = systems.build(w, data, idx, device, {}, {systems.LAX_CHECKED, "numpy"})
    want = _as_f32(fns["numpy"]())
    runner = fns[systems.LAX_CHECKED]
    tol = 1e-2 if w.dtype == "bfloat16" else 1e-5
    out, flag = runner.f(*runner.args)
    np.testing.assert_allclose(_as_f32(out), want, rtol=tol, atol=tol)
    assert flag.dtype == np.bool_ and flag.shape == () and not bool(flag)
    neg = systems.jax_inputs(data, w.with_negatives(data.shape, idx), device)
    out, flag = runner.f(*neg)
    np.testing.assert_allclose(_as_f32(out), want, rtol=tol, atol=tol)
    assert not bool(flag)
    # the runner's calls, blocked and pipelined, read each flag at the next call
    np.testing.assert_allclose(_as_f32(runner()), want, rtol=tol, atol=tol)
    np.testing.assert_allclose(_as_f32(runner.pipelined(3)), want, rtol=tol, atol=tol)
    runner.finish()


def _spec_bounds(w, shape, idx):
    """``(the flat position of an index, the size s it counts in)`` for an index of ``idx``."""
    if w.op == "onnx.gather_nd":
        return idx.shape[-1] - 1, shape[w.batch_dims + idx.shape[-1] - 1]
    return 0, shape[w.axis % len(shape)]


@pytest.mark.parametrize("key", ["W1", "W3", "W4", "W6", "W9", "W10"])
def test_lax_checked_flags_an_index_out_of_the_spec_range_and_the_next_call_raises(key):
    """-s is in range (wrapped to 0), -s - 1 and s are not: the flag says so; the bench's
    next call raises, blocked and pipelined, and the check bench's last read too."""
    import jax

    from xgather_bench import check
    w = WORKLOADS[key]
    data, idx = w.arrays("quick")
    device = jax.devices()[0]
    at, s = _spec_bounds(w, data.shape, idx)
    f = jax.jit(systems.lax_checked_fn(w))
    for value, bad in ((-s, False), (s - 1, False), (s, True), (-s - 1, True)):
        i = idx.copy()
        i.flat[at] = value
        out, flag = f(*systems.jax_inputs(data, i, device))
        assert bool(flag) is bad, (key, value)
        if not bad:
            ok = idx.copy()
            ok.flat[at] = value % s
            np.testing.assert_allclose(_as_f32(out), _as_f32(systems.numpy_runner(w, data, ok)()),
                                       rtol=1e-5, atol=1e-5)
    i = idx.copy()
    i.flat[at] = s
    d, bad_i = systems.jax_inputs(data, i, device)
    runner = systems.lax_checked_runner(w, d, bad_i)
    runner()  # returns: its flag is read at the next call
    with pytest.raises(systems.OutOfRangeFlag, match=f"lax-checked {key}: some index is out"):
        runner()  # blocked: ran, then read the previous flag; its own is left
    with pytest.raises(systems.OutOfRangeFlag):
        runner.call()  # pipelined: the previous flag read before the dispatch
    with pytest.raises(systems.OutOfRangeFlag):
        runner.pipelined(2)  # the first call's flag read at the second
    runner.call()
    with pytest.raises(systems.OutOfRangeFlag):
        runner.finish()
    runner.finish()  # read once
    # the check bench's system: its pipelined call, then the read that ends a workload
    fns = check._functions(w, d, bad_i, (), lax_checked=True)
    fns[check.LAX_CHECKED]()
    with pytest.raises(systems.OutOfRangeFlag):
        fns[check.LAX_CHECKED].finish()


def test_the_check_table_shows_the_default_over_lax_checked_against_its_limit():
    from xgather_bench import check

    def row(key, blk, pip, lax=True):
        r = {"workload": key, "title": WORKLOADS[key].title,
             "median_s": {"promise blocked": 1e-4}, "default/promise blocked": 1.0,
             "default/promise pipelined": 1.0, "sync/promise blocked": 1.0,
             "sync/promise pipelined": 1.0, "first_call_ratio": 1.0,
             "host_call_s": {m: 1e-5 for m in check.MODES},
             "host_split_s": {"dispatch": 1e-5, "flag_read": 0.0}}
        if lax:
            r.update({"default/lax-checked blocked": blk, "default/lax-checked pipelined": pip,
                      "lax-checked/promise blocked": 1.5, "lax-checked/promise pipelined": 2.5})
        return r
    record = {"device": {"kind": "cpu"}, "size": "quick", "pipeline": 10,
              "lax_checked_limit": 1.10,
              "results": [row("W1", 1.05, 1.20), row("W4", 1.30, 0.90), row("W7", 0, 0, False)]}
    text = check.table(record)
    assert "limit 1.10" in text
    assert re.search(r"def/lax-checked blk +def/lax-checked pip", text)
    lines = text.splitlines()
    start = next(n for n, ln in enumerate(lines) if "def/lax-checked blk" in ln)
    w1, w4 = lines[start + 1], lines[start + 2]
    assert re.search(r"^W1 .* 1\.05 +1\.20 over +1\.50 +2\.50$", w1), w1
    assert re.search(r"^W4 .* 1\.30 over +0\.90 +1\.50 +2\.50$", w4), w4
    assert not any(ln.startswith("W7 ") for ln in lines[start:])  # no check, no row
    # a record from before lax-checked: no such block
    for r in record["results"]:
        r.pop("default/lax-checked blocked", None)
    assert "lax-checked" not in check.table(record)


# -- framework steps: xgather.checked(step, jit=J) in jax.jit, nnx.jit, eqx.filter_jit --------

def _framework(name):
    from xgather_bench import frameworks
    if name == "nnx.jit":
        pytest.importorskip("flax.nnx")
        pytest.importorskip("optax")
    elif name == "eqx.filter_jit":
        pytest.importorskip("equinox")
    if not frameworks.checked_takes_jit():
        pytest.skip("xgather.checked(jit=...) not landed")
    return frameworks.framework(name)


@pytest.mark.parametrize("name", ["jax.jit", "nnx.jit", "eqx.filter_jit"])
def test_a_checked_framework_step_equals_the_promise_step_bit_for_bit(name):
    """xgather.checked(step, jit=J), the op in its default mode, 3 steps from the same start
    as J(step) in promise: the same losses and parameters, bit for bit; and the steps
    trained (the parameters moved, the loss fell)."""
    import jax

    from xgather_bench import frameworks
    fw = _framework(name)
    a = frameworks.arrays("quick")
    got = frameworks.differential(fw, a, jax.devices()[0], steps=3)
    (loss_c, params_c), (loss_p, params_p) = got["checked"], got["promise"]
    assert len(loss_c) == len(loss_p) == 3
    for x, y in zip(loss_c, loss_p, strict=True):
        np.testing.assert_array_equal(x, y)
    assert set(params_c) == set(params_p) == {"table", "w", "b"}
    for k in params_c:
        np.testing.assert_array_equal(params_c[k], params_p[k], err_msg=k)
        assert not np.array_equal(params_c[k], a[k]), k  # the update ran
    assert loss_c[2] < loss_c[0]
    assert frameworks.bitwise_equal(got)


def test_a_bad_id_in_a_checked_framework_step_is_raised():
    import jax

    import xgather
    from xgather_bench import frameworks
    fw = _framework("jax.jit")
    a = frameworks.arrays("tiny")
    a["ids"][3] = frameworks.SIZES["tiny"]["vocab"]
    with pytest.raises(xgather.OutOfBoundsError) as first:
        frameworks.differential(fw, a, jax.devices()[0], steps=2)
    # Both steps had the bad id. A CPU reads call 1's flag before call 2 runs; an
    # accelerator's flags are read in groups, so call 2 may have run: its failure is then
    # raised next, in its turn, and once.
    raised = [first.value.call]
    while True:
        try:
            xgather.raise_if_error()
            break
        except xgather.OutOfBoundsError as err:
            raised.append(err.call)
    assert raised in ([raised[0]], [raised[0], raised[0] + 1]), raised
    assert "index 16 " in str(first.value), first.value


def test_the_hand_written_check_of_the_frameworks_bench_gathers_and_raises_at_the_next_call():
    import jax
    import numpy as np

    from xgather_bench import frameworks
    a = frameworks.arrays("tiny")
    fw = frameworks.LaxChecked()
    dev = jax.devices()[0]
    hand, bare = frameworks.Loop(fw, fw.compiled(), a, dev), frameworks.Loop(
        fw, fw.jit_fn(fw.step(frameworks.PROMISE)), a, dev)
    for _ in range(3):  # the same bits as the bare step: the flag changes nothing
        np.testing.assert_array_equal(np.asarray(hand()), np.asarray(bare()))
    for k, v in bare.state.items():
        np.testing.assert_array_equal(np.asarray(hand.state[k]), np.asarray(v))
    a["ids"][3] = -frameworks.SIZES["tiny"]["vocab"] - 1  # one below the range
    bad = frameworks.Loop(fw, fw.compiled(), a, dev)
    bad()  # returns: its flag is read at the next call
    with pytest.raises(systems.OutOfRangeFlag, match="out of range"):
        bad()


def test_the_frameworks_table_marks_what_is_over_its_limits():
    from xgather_bench import frameworks

    def row(name, ratio, extra_us, same=True):
        return {"framework": name, "bitwise_equal": same, "ratio": ratio, "spread": 0.01,
                "median_s": {"promise": 1e-3, "checked": ratio * 1e-3},
                "over": ratio > frameworks.RATIO_LIMIT,
                "host_call_s": {"promise": 1e-5, "checked": 1e-5 + extra_us * 1e-6},
                "host_extra_us": extra_us,
                "host_over": name == "jax.jit" and extra_us > frameworks.HOST_LIMIT_US}
    record = {"device": {"kind": "cpu"}, "size": "quick", "shapes": frameworks.SIZES["quick"],
              "pipeline": 10, "limits": {"ratio": 1.05, "host_extra_us": 3.0,
                                         "host_limit_applies_to": "jax.jit"},
              "results": [row("jax.jit", 1.02, 5.0), row("nnx.jit", 1.10, 40.0, False),
                          {"framework": "eqx.filter_jit", "skipped": "equinox not installed"}]}
    lines = frameworks.table(record).splitlines()
    assert "limit 1.05" in lines[1] and "+3 us for jax.jit" in lines[1]
    jj = next(ln for ln in lines if ln.startswith("jax.jit "))
    nn = next(ln for ln in lines if ln.startswith("nnx.jit "))
    assert re.search(r" 1\.020 +1\.0% .* \+5\.0 over +same$", jj), jj
    assert re.search(r" 1\.100 over +1\.0% .* \+40\.0 +DIFFER$", nn), nn
    assert "eqx.filter_jit   skipped: equinox not installed" in lines


def test_the_frameworks_bench_end_to_end(tmp_path, capsys):
    """xgather-bench frameworks --quick: each framework's pair in paired rounds, its host
    times and the bitwise check; in --help; unknown frameworks refused."""
    from xgather_bench import frameworks
    from xgather_bench.__main__ import main
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0 and "xgather-bench frameworks" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["frameworks", "--frameworks", "jax.jit,keras"])
    assert e.value.code == 2 and "unknown frameworks ['keras']" in capsys.readouterr().err
    _framework("jax.jit")
    out = tmp_path / "frameworks.json"
    assert main(["frameworks", "--quick", "--repeats", "2", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    rec = json.loads(out.read_text())
    assert rec["schema"] == frameworks.SCHEMA and rec["pipeline"] == 10
    assert rec["limits"] == {"ratio": 1.05, "host_extra_us": 3.0,
                             "host_limit_applies_to": "jax.jit"}
    assert [r["framework"] for r in rec["results"]] == list(frameworks.FRAMEWORKS)
    for r in rec["results"]:
        if "skipped" in r:
            assert frameworks.missing(r["framework"]) == r["skipped"]
            continue
        assert r["rounds"] == 2 and r["bitwise_equal"] is True
        # the check written by hand is timed beside the step of arrays only, host time alone
        hand = {frameworks.HAND} if r["framework"] == frameworks.ARRAYS_ONLY else set()
        assert set(r["samples_s"]) == {"checked", "promise"}
        assert set(r["host_call_s"]) == {"checked", "promise"} | hand
        assert ("host_hand_extra_us" in r) == bool(hand)
        if hand:
            assert r["host_hand_extra_us"] == pytest.approx(
                (r["host_call_s"][frameworks.HAND] - r["host_call_s"]["promise"]) * 1e6)
            assert f"{r['host_hand_extra_us']:+.1f} over J" in text
        assert r["ratio"] == pytest.approx(stats.paired_ratio(
            [s * 10 for s in r["samples_s"]["checked"]],
            [s * 10 for s in r["samples_s"]["promise"]]))
        row = next(ln for ln in text.splitlines() if ln.startswith(r["framework"] + " "))
        assert f"{r['ratio']:.3f}" in row.split()
