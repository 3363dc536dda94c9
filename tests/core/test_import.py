"""`import hcomm` registers backend "hcomm" and does nothing else (checked in a fresh interpreter)."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROBE = r"""
import json, os, sys, threading
import torch, torch.distributed as dist
before_env = dict(os.environ)
before_threads = threading.active_count()
before_plugins = set(dist.Backend._plugins)
before_funcs = {n: id(getattr(dist, n)) for n in dir(dist) if callable(getattr(dist, n))}
before_torch = {n: id(getattr(torch, n)) for n in ("tensor", "empty", "cat")}
before_modules = set(sys.modules)
import hcomm
new_modules = sorted(m for m in set(sys.modules) - before_modules if not m.startswith(("hcomm", "yaml", "numpy")))
print(json.dumps({
    "env_same": dict(os.environ) == before_env,
    "threads": [before_threads, threading.active_count()],
    "new_plugins": sorted(set(dist.Backend._plugins) - before_plugins),
    "capability": list(dist.Backend.backend_capability.get("hcomm", [])),
    "attr": getattr(dist.Backend, "HCOMM", None),
    "patched_dist": sorted(n for n, i in before_funcs.items() if id(getattr(dist, n)) != i),
    "patched_torch": sorted(n for n, i in before_torch.items() if id(getattr(torch, n)) != i),
    "is_initialized": dist.is_initialized(),
    "errors": [issubclass(hcomm.HCommValueError, ValueError), issubclass(hcomm.HCommValueError, hcomm.HCommError)],
    "new_modules": new_modules,
}))
"""


def test_import_registers_the_backend_and_changes_nothing_else():
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("HCOMM_DEBUG", None)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["env_same"]
    assert res["threads"][0] == res["threads"][1]
    assert res["new_plugins"] == ["HCOMM"]
    assert "cpu" in res["capability"] and res["attr"] == "hcomm"
    assert res["patched_dist"] == [] and res["patched_torch"] == []
    assert res["is_initialized"] is False
    assert res["errors"] == [True, True]


def test_hcomm_debug_is_a_documented_setting():
    from hcomm.settings import all_settings, markdown_table

    names = {s.name: s for s in all_settings()}
    assert "HCOMM_DEBUG" in names and names["HCOMM_DEBUG"].default is False
    assert "disagreeing rank" in names["HCOMM_DEBUG"].help
    assert "| `HCOMM_DEBUG` |" in markdown_table()


def test_algorithm_table_lists_every_algorithm_once_with_a_description():
    from hcomm import _C

    table = _C.algorithms()
    names = [n for n, _ in table]
    assert names[0] == "native" and len(names) == len(set(names))
    flat = ["ring", "ring_rs", "ring_ag", "tree", "direct", "pairwise", "dissemination"]
    assert [n for n in names if n in flat] == flat  # preference order of the flat algorithms
    assert all(desc for _, desc in table)
    assert set(_C.OP_KINDS) >= {"all_reduce", "reduce_scatter_v", "all_gather_v", "all_to_all_v", "barrier"}
