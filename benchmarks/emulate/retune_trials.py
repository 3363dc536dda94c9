"""How well the quota retune holds the speeds' ratios, over many cluster ups back to back.

Each trial brings a cluster up (calibration cached, the retune run afresh from its per-boot cache), reads
what the retune reported, then measures the ranks' speeds independently (``check_compute``, 2 s, the
check `hcomm emulate check` and the emulator tests use) and takes the cluster down.  With
``--load S`` a busy loop outside every quota runs for the first S seconds of each up on one core: a
transient load such as the previous launch's teardown or the next launcher's imports.

    python benchmarks/emulate/retune_trials.py --cluster mixed-speed --trials 12 [--load 2.0]

Prints one line per trial and the spread of the independent check's worst error; run as root.
"""
import argparse
import statistics
import subprocess
import sys
import time

from hcomm.emulate.check import check_compute
from hcomm.emulate.cluster import Cluster
from hcomm.emulate.spec import load_spec


def busy(seconds: float, cpu: int) -> subprocess.Popen:
    code = (f"import os, time; os.sched_setaffinity(0, {{{cpu}}}); end = time.time() + {seconds}\n"
            "while time.time() < end: pass")
    return subprocess.Popen([sys.executable, "-c", code])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cluster", default="mixed-speed")
    p.add_argument("--trials", type=int, default=12)
    p.add_argument("--load", type=float, default=0.0, help="seconds of busy loop on --load-cpu at each up")
    p.add_argument("--load-cpu", type=int, default=1)
    args = p.parse_args()
    worst = []
    for t in range(args.trials):
        load = busy(args.load, args.load_cpu) if args.load > 0 else None
        t0 = time.time()
        with Cluster(load_spec(args.cluster)) as c:
            up_s = time.time() - t0
            if load:
                load.wait()
            plan = c.cpu_plan
            rows, _ = check_compute(c, seconds=2.0)
        err = max(abs(r.error) for r in rows)
        worst.append(err)
        factors = "/".join(f"{f:.2f}" for _, f in sorted(plan.retuned.items())) or "-"
        reported = "-" if plan.retune_error is None else f"{plan.retune_error:.0%}"
        print(f"trial {t}: up {up_s:.1f} s, factors x{factors}, retune's last error {reported}, "
              f"checked worst {err:.0%} ({' '.join(r.measured.split(' ')[0] for r in rows)})", flush=True)
    q = statistics.quantiles(worst, n=4) if len(worst) > 1 else worst * 3
    print(f"{args.trials} trials, checked worst error: median {statistics.median(worst):.0%}, "
          f"quartiles {q[0]:.0%}-{q[2]:.0%}, max {max(worst):.0%}, over 15 %: {sum(w > 0.15 for w in worst)}")


if __name__ == "__main__":
    main()
