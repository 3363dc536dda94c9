"""A heterogeneous cluster emulated on one Linux box.

Per node a network namespace whose uplink is rate-limited with ``tc tbf``
(both directions) and delayed by a user-space wire; per rank a cgroup whose
CPU quota follows its relative speed and whose memory limit is its emulated
device memory; one ``torchrun`` per node.  See ``docs/emulate.md``.

Nothing is created at import time, and nothing is imported either: each rank
runs ``python -m hcomm.emulate.rankwrap``, and a package that imports its own
submodules (launch once imported rankwrap) makes runpy warn, on every rank,
that rankwrap was in sys.modules before it ran.  The names below load on
first use (PEP 562).
"""
import importlib

_EXPORTS = {
    "Cluster": "cluster", "EmulatorUnavailable": "cluster",
    "run": "launch", "run_on": "launch",
    "DEFAULT_PRESET": "catalog", "presets": "catalog",
    "ClusterSpec": "spec", "NodeSpec": "spec", "RankSpec": "spec", "SpecError": "spec", "load_spec": "spec",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value
