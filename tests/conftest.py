import os

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, settings

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")

settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=40,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def backend_compiles():
    """How many programs XLA compiles (JAX's monitoring event), as a list of durations."""
    seen: list[float] = []

    def listen(event, duration, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            seen.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listen)
    yield seen
    jax.monitoring.unregister_event_duration_listener(listen)


# tests/multidevice needs 8 devices: tests/test_sharded.py runs it in its own process.
collect_ignore = ["multidevice"]


def pytest_collection_modifyitems(items):
    """The long tests (a fresh Python each, or a bench run) go first: pytest-xdist hands
    tests out in this order, so that none of them is left running alone at the end."""
    def long(item):
        return item.get_closest_marker("subprocess") is not None or \
            item.get_closest_marker("slow") is not None
    items.sort(key=lambda item: not long(item))


@pytest.fixture(autouse=True)
def _no_unread_check_failures():
    """A test leaves no failure of ``xgather.checked`` unread in its thread."""
    import xgather
    yield
    try:
        xgather.raise_if_error()
    except Exception as err:  # noqa: BLE001 - whatever it is, the test left it
        pytest.fail(f"the test left an unread failure of xgather.checked: {err}")


def pytest_runtest_logreport(report):
    """With ``XGATHER_FAILURES`` set to a file (``.ci/gpu`` sets it), each failure's
    traceback is appended to it as the failure comes, so that a run cut at its time limit
    keeps them. Written once: by the xdist controller, or by a run without workers."""
    path = os.environ.get("XGATHER_FAILURES")
    if path and report.failed and "PYTEST_XDIST_WORKER" not in os.environ:
        with open(path, "a") as f:
            f.write(f"=== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")
