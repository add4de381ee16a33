"""Other installed pytest plugins break nothing (tests/plugin_guard.py): a plugin that warns
while pytest loads, adds its options or configures it neither stops the suite nor the
tests that start pytest again in a fresh Python (the x64 reruns)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: One test that starts pytest in a subprocess, under pytest-xdist, as CI runs it.
SELECTION = ["tests/test_sharded.py", "-k", "sixty_four_bit_data_with_x64_on or string_data"]


def _pytest_with(*plugin_dirs: Path) -> subprocess.CompletedProcess:
    path = os.pathsep.join(filter(None, [*map(str, plugin_dirs), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "PYTHONWARNINGS": ""}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p",
                           "no:cacheprovider", *SELECTION], capture_output=True, text=True,
                          env=env, timeout=600, cwd=ROOT)


def _assert_passed(proc: subprocess.CompletedProcess, *warnings: str) -> None:
    tail = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    assert "2 passed" in proc.stdout and "failed" not in proc.stdout, tail
    assert "INTERNALERROR" not in tail, tail
    for warning in warnings:
        assert warning in proc.stdout + proc.stderr, tail  # shown, not raised


def _warning_plugin(where: Path) -> Path:
    """A stand-in plugin that warns while pytest loads, found through its entry point as
    pip installs one."""
    where.mkdir()
    (where / "warning_plugin.py").write_text(
        "import warnings\n\n"
        "def pytest_addoption(parser):\n"
        "    warnings.warn('warning_plugin: an option added', DeprecationWarning)\n\n"
        "def pytest_configure(config):\n"
        "    warnings.warn('warning_plugin: configured with a warning', UserWarning)\n")
    info = where / "warning_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: warning-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[pytest11]\nwarning_plugin = warning_plugin\n")
    return where


@pytest.mark.subprocess
def test_a_warning_plugin_and_pytest_benchmark_under_xdist(tmp_path):
    # Both in one pytest: a plugin that warns at configure (shown, not raised), and
    # pytest-benchmark 4.0.0, which warns at start-up when xdist is active (a GPU image
    # has it).
    warning = _warning_plugin(tmp_path / "warning")
    site = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                          "--target", str(site), "pytest-benchmark==4.0.0", "py-cpuinfo"],
                         capture_output=True, text=True, timeout=300)
    if pip.returncode:  # no package index: the warning plugin alone, then the skip
        _assert_passed(_pytest_with(warning), "warning_plugin: configured with a warning")
        pytest.skip("pip could not install pytest-benchmark 4.0.0 (no package index): "
                    + pip.stderr[-300:])
    _assert_passed(_pytest_with(warning, site), "warning_plugin: configured with a warning",
                   "Benchmarks are automatically disabled")
