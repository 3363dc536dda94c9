"""The ``hcomm`` command: one entry point, each subcommand owned by its module.

Each subcommand's module exposes ``main(argv) -> int`` and parses its own
arguments, so adding a tool never touches the others.
"""
from __future__ import annotations

import importlib
import sys
from typing import List, Optional

# name -> (module, one-line help)
SUBCOMMANDS = {
    "train": ("hcomm.train.cli", "train a Llama-style model: hcomm's plan vs the homogeneous baseline (the main job)"),
    "plan": ("hcomm.train.plan_cli", "print the plan auto would run, its predicted step time and what it beat"),
    "calibrate": ("hcomm.parallel.calibrate", "per-piece deviation of each compute dtype from fp32 on one device kind"),
    "demo": ("hcomm.demo", "spawn local ranks and compare hcomm with gloo (collectives only)"),
    "bench": ("hcomm.bench.cli", "nccl-tests style bandwidth benchmarks: hcomm bench OP ..."),
    "topo": ("hcomm.bench.topo", "measured link matrix (alpha, beta) as a table and a heatmap"),
    "emulate": ("hcomm.emulate.cli", "bring up / run on / check an emulated heterogeneous cluster"),
    "settings": ("hcomm.cli", "list every HCOMM_* setting with its default and meaning"),
}


def _usage() -> str:
    lines = ["usage: hcomm COMMAND [ARGS...]", "", "commands:"]
    for name, (_, text) in SUBCOMMANDS.items():
        lines.append(f"  {name:<9} {text}")
    return "\n".join(lines)


def _settings_main(argv: List[str]) -> int:
    import argparse

    from hcomm.settings import effective_table

    p = argparse.ArgumentParser(prog="hcomm settings", description=SUBCOMMANDS["settings"][1]
                                + ", and the value in effect in this environment")
    p.parse_args(argv)
    print(effective_table())
    return 0


def _user_errors() -> tuple:
    """Exceptions that mean the user asked for something wrong: one line, no traceback."""
    from hcomm.errors import HCommValueError

    errors = [ValueError, HCommValueError, FileNotFoundError]
    try:
        from hcomm.emulate.spec import SpecError

        errors.append(SpecError)
    except ImportError:
        pass
    return tuple(errors)


def _run(name: str, rest: List[str]) -> int:
    if name == "settings":
        return _settings_main(rest)
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return int(module.main(rest) or 0)


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"hcomm: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    # built before the try: importing yaml's C extension while an exception
    # (e.g. argparse's SystemExit for --help) is in flight fails
    user_errors = _user_errors()
    try:
        return _run(name, rest)
    except user_errors as exc:  # anything else is a bug and keeps its traceback
        print(f"hcomm {name}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
