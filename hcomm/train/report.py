"""What ``hcomm train`` prints and writes: the side-by-side table, JSON, plots.

Plans are compared at equal tokens: every plan runs the same global batches
for the same steps, so "loss at equal tokens" is the loss of the same step
(the mean of the last quarter of steps, to smooth batch noise) and the
held-out loss after the last step.
"""
from __future__ import annotations

import datetime
import json
import math
import platform
from typing import List

import torch


def _tail_loss(result) -> float:
    losses = [r["loss"] for r in result.steps]
    tail = losses[-max(1, len(losses) // 4):]
    return sum(tail) / len(tail)


def _rank_split(result, warmup: int) -> List[dict]:
    """Mean seconds per step of each rank's compute, comm, idle after warm-up."""
    steps = result.steps[warmup:] or result.steps
    out = []
    for r in range(len(steps[0]["ranks"])):
        keys = ("compute_s", "comm_s", "idle_s", "optimizer_s")
        out.append({k: sum(s["ranks"][r][k] for s in steps) / len(steps) for k in keys})
    return out


def side_by_side(args, plans, results, view) -> str:
    w = max(10, *(len(p.name) + 2 for p in plans))
    lines = ["", f"{'plan':<{w}}{'tokens/s':>10}{'step ms':>9}{'predicted':>11}{'loss@end':>10}{'eval loss':>11}"
                 f"   samples per rank"]
    for plan, res in zip(plans, results):
        predicted = res.predicted_step_s if math.isnan(res.predicted_as_run_s) else res.predicted_as_run_s
        pred = f"{predicted * 1e3:.0f}" if not math.isnan(predicted) else "-"
        lines.append(f"{plan.name:<{w}}{res.tokens_per_s:>10,.0f}{res.measured_step_s * 1e3:>9.0f}{pred:>11}"
                     f"{_tail_loss(res):>10.4f}{res.eval_loss:>11.4f}   {res.counts or plan.batch_counts()}"
                     + (f" (planned {res.resplit['from']})" if res.resplit.get("from") not in (None, res.counts)
                        else ""))
    for plan, res in zip(plans, results):
        if not math.isnan(res.predicted_as_run_s):
            lines.append(f"  {plan.name}: predicted {res.predicted_step_s * 1e3:.0f} ms as planned, "
                         f"{res.predicted_as_run_s * 1e3:.0f} ms with the rows re-split after step "
                         f"{res.resplit['after_steps']} (the plan its measured steps ran)")
        for r in res.replans:
            lines.append(f"  {plan.name}: after step {r['after_steps']} rank(s) {r['drifted']} drifted "
                         + ", ".join(f"{d:+.0%}" for d in r["drift"]) + f": {r.get('what', 're-split')} {r['from']} -> {r['to']}")
    lines.append("")
    lines.append("per rank, mean ms per step after warm-up: compute / comm not hidden / idle (waiting for peers)")
    for plan, res in zip(plans, results):
        split = _rank_split(res, args.warmup_steps)
        cells = [f"r{r} {view.devices[r]}: {s['compute_s'] * 1e3:.0f}/{s['comm_s'] * 1e3:.0f}/{s['idle_s'] * 1e3:.0f}"
                 for r, s in enumerate(split)]
        lines.append(f"  {plan.name:<{w}}" + "   ".join(cells))
    if any(p.backend == "ddp-gloo" for p in plans):
        lines.append("  (DDP reduces inside backward: its compute includes the communication it does not hide)")
    if len(results) >= 2:
        base, best = results[-1], results[0]
        ratio = best.tokens_per_s / base.tokens_per_s
        gap = (_tail_loss(best) - _tail_loss(base)) / _tail_loss(base)
        eval_gap = (best.eval_loss - base.eval_loss) / base.eval_loss
        lines.append("")
        lines.append(f"speed-up {plans[0].name} vs {plans[-1].name}: {ratio:.2f}x tokens/s at equal tokens "
                     f"({args.steps} steps x {plans[0].global_batch * plans[0].seq_len} tokens); loss "
                     f"{_tail_loss(best):.4f} vs {_tail_loss(base):.4f} ({gap:+.2%}), eval {best.eval_loss:.4f} vs "
                     f"{base.eval_loss:.4f} ({eval_gap:+.2%})")
    return "\n".join(lines)


def environment() -> dict:
    import hcomm

    return {"date": datetime.datetime.now().isoformat(timespec="seconds"), "host": platform.node(),
            "machine": platform.machine(), "processor": platform.processor(), "python": platform.python_version(),
            "torch": torch.__version__, "hcomm": hcomm.__version__}


def write_json(path: str, args, plans, results, view, data, n_params: int) -> None:
    doc = {"environment": environment(), "args": {k: v for k, v in vars(args).items()},
           "model": {"name": args.model, "parameters": n_params, "hf": args.hf},
           "data": {"source": data.source, "tokenizer": data.tokenizer, "vocab_size": data.vocab_size},
           "cluster": {"devices": view.devices, "islands": view.islands,
                       "profiles": [p.to_dict() for p in view.profiles], "optimizer_s": view.optimizer_s,
                       "calibration": view.calibration},
           "runs": [{"plan": plan.to_dict(), "tokens_per_s": res.tokens_per_s,
                     "measured_step_s": res.measured_step_s, "predicted_step_s": res.predicted_step_s,
                     "predicted_as_run_s": res.predicted_as_run_s,
                     "eval_loss": res.eval_loss, "wall_s": res.wall_s, "counts": res.counts,
                     "resplit": res.resplit, "replans": res.replans, "steps": res.steps}
                    for plan, res in zip(plans, results)]}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, default=str)


def plot(path: str, args, plans, results, view) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_split) = plt.subplots(1, 2, figsize=(12, 4.5))
    for plan, res in zip(plans, results):
        t, elapsed = [], 0.0
        for r in res.steps:
            elapsed += r["seconds"]
            t.append(elapsed)
        ax_loss.plot(t, [r["loss"] for r in res.steps], label=f"{plan.name} ({res.tokens_per_s:,.0f} tok/s)")
    ax_loss.set_xlabel("training seconds")
    ax_loss.set_ylabel("global-batch loss")
    ax_loss.legend()
    ax_loss.set_title("loss against time")
    width = 0.8 / len(results)
    world = len(view.devices)
    for i, (plan, res) in enumerate(zip(plans, results)):
        split = _rank_split(res, args.warmup_steps)
        xs = [r + i * width for r in range(world)]
        bottom = [0.0] * world
        for key, color in (("compute_s", "tab:blue"), ("comm_s", "tab:red"), ("idle_s", "tab:gray"),
                           ("optimizer_s", "tab:green")):
            heights = [s[key] for s in split]
            ax_split.bar(xs, heights, width, bottom=bottom, color=color, edgecolor="black", linewidth=0.3,
                         label=key[:-2] if i == 0 else None)
            bottom = [b + h for b, h in zip(bottom, heights)]
        for x in xs:
            ax_split.text(x, 0, plan.name, rotation=90, va="bottom", ha="center", fontsize=7, color="white")
    ax_split.set_xticks([r + width * (len(results) - 1) / 2 for r in range(world)])
    ax_split.set_xticklabels([f"r{r} {d}" for r, d in enumerate(view.devices)])
    ax_split.set_ylabel("seconds per step")
    ax_split.set_title("per-rank time")
    ax_split.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(args, plans, results, view, data, n_params: int) -> None:
    print(side_by_side(args, plans, results, view), flush=True)
    if args.json:
        write_json(args.json, args, plans, results, view, data, n_params)
        print(f"hcomm train: wrote {args.json}", flush=True)
    if args.plot:
        plot(args.plot, args, plans, results, view)
        print(f"hcomm train: wrote {args.plot}", flush=True)
