"""``hcomm plan``: the plan ``hcomm train`` would run, without training.

It takes ``hcomm train``'s options, brings up the same cluster, measures
the same profiles (cached after the first time) and prints each rank's
profile, the plan ``auto`` chose, its predicted step time and the
alternatives it beat.
"""
from __future__ import annotations

from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    from hcomm.train.cli import main as train_main

    argv = list(argv or [])
    if not any(a == "--plan" or a.startswith("--plan=") for a in argv):
        argv += ["--plan", "auto"]
    return train_main(argv + ["--print-plan-only"])
