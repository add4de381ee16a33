"""Other installed pytest plugins break nothing (loaded first: ``-p tests.plugin_guard``).

The suite runs with ``filterwarnings = error``, which is for the code under test. pytest
applies it while it imports plugins, adds their options and configures them, so a plugin
that warns there (pytest-benchmark 4.0.0 under xdist, and on Python 3.12+ about
``datetime.utcnow``) would stop the run before a test starts. Warnings that come from
another plugin's own modules are shown instead; everything else stays an error.
"""

from __future__ import annotations

import re
import warnings
from importlib.metadata import entry_points

import pytest

_OURS = {"tests", "xgather", "xgather_bench", "_pytest", "pytest"}


def _foreign_packages() -> set[str]:
    """The top-level packages of the installed pytest plugins (entry point ``pytest11``)."""
    return {ep.value.split(":")[0].split(".")[0]
            for ep in entry_points(group="pytest11")} - _OURS


def _their_modules() -> str | None:
    """A pattern for the modules of the installed plugins' packages (None: no plugin)."""
    packages = _foreign_packages()
    if not packages:
        return None
    return rf"({'|'.join(sorted(map(re.escape, packages)))})(\.|$)"


def _show_their_warnings() -> None:
    if modules := _their_modules():
        warnings.filterwarnings("default", module=modules)


# While pytest imports the plugins and adds their options (this module is imported first,
# inside the same warnings context) ...
_show_their_warnings()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    # ... and while it configures them (a context of its own, entered before this hook;
    # pytest 8.4 to 9.1 enter it in their warnings plugin's pytest_configure, after this
    # hook, from the ini's filters: there the filter goes too).
    _show_their_warnings()
    if modules := _their_modules():
        config.addinivalue_line("filterwarnings", f"default:::{modules}")
