"""``hcomm plan``: the plan ``hcomm train`` would run, without training.

It takes ``hcomm train``'s options, brings up the same cluster, measures
the same profiles (cached after the first time) and prints each rank's
profile, the plan ``auto`` chose, its predicted step time and the
alternatives it beat.

``hcomm plan --offline --cluster SPEC.yaml --model llama-70b`` plans a
cluster that is not here (no processes, nothing measured): the cluster spec
in the emulator's YAML format (device kinds, counts, memories, links) and
published device figures (``hcomm.parallel.planner.figures``) give the view,
and the joint search (``hcomm.parallel.planner.search``) prints the chosen
plan and the runners-up.  ``docs/training.md`` shows how to launch the plan
across hosts with ``torchrun``.
"""
from __future__ import annotations

import argparse
import sys
from typing import Dict, List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(argv or [])
    if "--offline" in argv:
        return offline(argv)
    from hcomm.train.cli import main as train_main, parse

    if "-h" in argv or "--help" in argv:   # train's options, under plan's name (exits, as argparse does)
        print("hcomm plan: the plan hcomm train would run, its predicted step time and what it beat, without "
              "training; it takes hcomm train's options below.  A cluster that is not here: "
              "hcomm plan --offline --help.\n")
        parse(["--help"], prog="hcomm plan")

    if not any(a == "--plan" or a.startswith("--plan=") for a in argv):
        argv += ["--plan", "auto"]
    return train_main(argv + ["--print-plan-only"])


def _prices(text: Optional[str]) -> Optional[Dict[str, float]]:
    if not text:
        return None
    out = {}
    for item in text.split(","):
        kind, sep, value = item.partition("=")
        try:
            out[kind.strip().upper()] = float(value)
        except ValueError:
            raise ValueError(f"--prices {text!r}: expected KIND=PRICE,... (price per device-hour), "
                             f"got {item!r}") from None
        if not sep:
            raise ValueError(f"--prices {text!r}: expected KIND=PRICE, got {item!r}")
    return out


def offline(argv: List[str]) -> int:
    p = argparse.ArgumentParser(prog="hcomm plan --offline", description="plan a cluster from its spec and "
                                "published device figures (nothing runs, nothing is measured)")
    p.add_argument("--offline", action="store_true")
    p.add_argument("--cluster", required=True, help="cluster spec (the emulator's YAML format) or preset")
    p.add_argument("--model", default="llama-70b", help="named config or YAML file (default llama-70b)")
    p.add_argument("--global-batch", type=int, default=None, help="samples per step (default: one per device)")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--micro-batch", type=int, default=1, help="samples per micro-batch the figures are costed at")
    p.add_argument("--dtype", default="per-device", help="compute dtype of every device, per-device (default: "
                   "each kind's best) or search (the search weighs fp32 against each kind's best by its figures)")
    p.add_argument("--mfu", type=float, default=0.45, help="fraction of the published peak a matmul reaches")
    p.add_argument("--prices", default=None, help="cost per device-hour by kind, e.g. A100=1.5,H800=2.2,910B=1.1")
    p.add_argument("--allow-async", action="store_true", help="also consider islands syncing every H steps")
    p.add_argument("--top", type=int, default=12, help="rows of the candidates table")
    p.add_argument("--save-plan", default=None, help="write the chosen plan as YAML (hcomm train --plan PATH)")
    args = p.parse_args(argv)
    from hcomm.emulate.spec import load_spec
    from hcomm.models import get_config
    from hcomm.parallel.planner.offline import view_from_spec
    from hcomm.parallel.planner.search import search

    try:
        spec = load_spec(args.cluster, max_nodes=None)
        config = get_config(args.model)
        prices = _prices(args.prices)
        view = view_from_spec(spec, config, micro_batch=args.micro_batch, seq_len=args.seq_len,
                              dtype="fp32" if args.dtype == "search" else args.dtype, mfu=args.mfu)
        batch = args.global_batch or view.world_size
        kw = dict(dim=config.dim, kv_heads=config.kv_heads, allow_async=args.allow_async, prices=prices)
        dtype_notes = []
        if args.dtype == "search":
            from hcomm.parallel.planner import dtypes as per_device

            view.low_precision_profiles = view_from_spec(spec, config, micro_batch=args.micro_batch,
                                                         seq_len=args.seq_len, dtype="per-device",
                                                         mfu=args.mfu).profiles
            result, _, dtype_notes = per_device.search_dtypes(view, batch, args.seq_len, **kw)
        else:
            result = search(view, batch, args.seq_len, **kw)
    except ValueError as error:
        print(f"hcomm plan --offline: {error}", file=sys.stderr)
        return 2
    kinds: Dict[str, int] = {}
    for d in view.devices:
        kinds[d] = kinds.get(d, 0) + 1
    print(f"hcomm plan --offline: {spec.name}, {view.world_size} devices ("
          + ", ".join(f"{n} x {k}" for k, n in kinds.items()) + f"), {args.model}, global batch {batch} x "
          f"{args.seq_len} tokens; figures at {args.mfu:.0%} of peak, dtype {args.dtype}")
    print("\n".join(result.table(batch * args.seq_len, prices, view.devices, top=args.top)))
    for note in [*dtype_notes, *result.notes]:
        print(f"  - {note}")
    plan = result.best.plan
    plan.name = plan.name or "search"
    if args.save_plan:
        plan.save(args.save_plan)
        print(f"hcomm plan --offline: wrote {args.save_plan}")
    return 0
