"""Command lines for the emulator's own helper processes (rank wrapper,
calibration loops) that import ``hcomm.emulate`` without running
``hcomm/__init__``.

``import hcomm`` registers the torch backend, which imports torch: seconds of
start-up and ~400 MiB inside a rank's CPU and memory cgroups, before the
user's program has even started.  These helpers need none of it, so they run
with a bare ``hcomm`` package object whose ``__path__`` points at the real
one; the user's program, started by the wrapper, imports hcomm normally.
"""
from __future__ import annotations

import os
import sys
from typing import List

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_PRELUDE = (
    "import sys, types\n"
    "pkg = types.ModuleType('hcomm')\n"
    f"pkg.__path__ = [{_PACKAGE_DIR!r}]\n"
    "sys.modules['hcomm'] = pkg\n"
)


def module_command(module: str) -> List[str]:
    """argv that runs ``python -m MODULE`` (arguments follow) without hcomm/__init__."""
    code = _PRELUDE + f"import runpy\nsys.argv[0] = {module!r}\nrunpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"
    return [sys.executable, "-c", code]


def probe_command() -> List[str]:
    """argv that runs ``probes.py`` as a plain script (arguments follow).

    No package import at all: probes run inside rank cgroups whose quota
    turns every 10 ms of start-up CPU into up to 130 ms of wall time.
    """
    return [sys.executable, "-S", os.path.join(_PACKAGE_DIR, "emulate", "probes.py")]
