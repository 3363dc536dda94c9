"""How far apart are two profiles of the same rank?  The floor under the planner's accuracy on this box.

Every rank of an emulated preset profiles the ``small`` model (``hcomm.parallel.profile.measure``, as
``hcomm train`` does: fp32, micro-batch 4, seq 64, budget 10 s) ``--repeats`` times back to back, all
ranks at once, and the same again with the profile's minimum timed span raised from
``profile.MIN_TIMED_S`` to 2 s.  A prediction is made from one such profile per rank, so the spread of
the repeats bounds how close any prediction can come to a measurement taken in another few seconds.

    python benchmarks/planner/profile_repeat.py [--cluster mixed] [--repeats 4]

Writes ``benchmarks/results/profile-repeat-<date>.md``.  Needs root (emulator).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(REPO, "benchmarks", "results")
SPANS = (None, 2.0)   # None: the profile's own minimum


def rank_main(out_dir: str, repeats: int) -> None:
    """On one emulated rank: the profiles' whole-model seconds per span setting, to ``out_dir``."""
    import torch
    import torch.distributed as dist

    from hcomm.emulate.rankwrap import enter_cpu_quota, leave_cpu_quota
    from hcomm.models.configs import build_model
    from hcomm.parallel import profile

    dist.init_process_group("gloo")
    enter_cpu_quota()
    torch.manual_seed(0)
    model = build_model("small", vocab_size=2048)
    own_min = profile.MIN_TIMED_S
    rows = {}
    for span in SPANS:
        profile.MIN_TIMED_S = own_min if span is None else span
        totals, took = [], []
        for _ in range(repeats):
            dist.barrier()
            began = time.perf_counter()
            p = profile.measure(model, micro_batch=4, seq_len=64, vocab_size=2048, budget_s=10.0)
            took.append(time.perf_counter() - began)
            totals.append(sum(c.fwd_s + c.bwd_s for c in p.layers))
        rows[str(profile.MIN_TIMED_S)] = {"totals": totals, "took": took}
    profile.MIN_TIMED_S = own_min
    rank = dist.get_rank()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "device": os.environ.get("HCOMM_EMU_DEVICE", "?"), "rows": rows}, f)
    dist.barrier()
    leave_cpu_quota()
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cluster", default="mixed")
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--rank-out", help=argparse.SUPPRESS)   # set when run on a rank
    args = ap.parse_args()
    if args.rank_out:
        rank_main(args.rank_out, args.repeats)
        return 0
    import io

    import torch

    from hcomm.emulate import run

    out_dir = tempfile.mkdtemp(prefix="profile-repeat-")
    log = io.StringIO()
    code = run(args.cluster, [sys.executable, os.path.abspath(__file__), "--repeats", str(args.repeats),
                              "--rank-out", out_dir], out=log, defer_quota=True, show_cpu_plan=True)
    if code != 0:
        print(log.getvalue()[-4000:])
        return code
    ranks = sorted((json.load(open(os.path.join(out_dir, n))) for n in os.listdir(out_dir)), key=lambda d: d["rank"])
    emulated = [line for line in log.getvalue().splitlines() if "hcomm emulate: speed" in line]
    date = datetime.date.today().isoformat()
    lines = [f"# Profile repeatability on `{args.cluster}`, {date}", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} cores; Python {platform.python_version()}, torch "
             f"{torch.__version__}.  `benchmarks/planner/profile_repeat.py --cluster {args.cluster} --repeats "
             f"{args.repeats}`: every rank profiles the `small` model (fp32, micro-batch 4, seq 64, budget 10 s) "
             f"{args.repeats} times back to back, all ranks at once, with the profile's own minimum timed span "
             "and with 2 s.  Spread: (largest - smallest) / smallest of the whole-model seconds.", ""]
    lines += [f"Emulated CPU: {e.split('hcomm emulate: ', 1)[1]}" for e in emulated] + [""]
    lines += ["| rank | device | min timed s | whole-model ms per profile | spread | seconds per profile |",
              "|---|---|---|---|---|---|"]
    spreads = []
    for d in ranks:
        for span, row in d["rows"].items():
            t = row["totals"]
            spread = (max(t) - min(t)) / min(t)
            spreads.append(spread)
            lines.append(f"| {d['rank']} | {d['device']} | {span} | {' / '.join(f'{x * 1e3:.0f}' for x in t)} | "
                         f"{spread:.0%} | {' / '.join(f'{x:.1f}' for x in row['took'])} |")
    lines += ["", f"Median spread {statistics.median(spreads):.0%}, largest {max(spreads):.0%}."]
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"profile-repeat-{date}.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
