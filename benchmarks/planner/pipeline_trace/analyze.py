"""One step of a traced pipeline run (``sitecustomize.py`` here), per rank: the schedule's time from its
first forward to its last backward, the time inside its own chunks (busy), the TP all-reduces inside
them, the waits for transfers, what follows the last backward until the next step's first forward,
and per chunk kind (F/B and stage) its milliseconds, all-reduce ms and
count.  ``analyze.py [RANKS]``; the second-to-last and third-to-last steps of the run are shown."""
import json
import os
import sys


def steps_of(events):
    """Start times of every step: the forward of micro-batch 0 on the rank's first stage."""
    chunks = [e for e in events if e[0] in "FB"]
    first = min(e[3] for e in chunks)
    return [e[1] for e in chunks if e[0] == "F" and e[3] == first and e[4] == 0]


def account(events, start, end):
    inside = [e for e in events if start <= e[1] < end]
    last = max(e[2] for e in inside if e[0] == "B")
    chunks = [e for e in inside if e[0] in "FB"]
    reduces = [e for e in inside if e[0] == "AR" and e[1] < last]
    waits = sum(min(e[2], last) - e[1] for e in inside if e[0] == "wait" and e[1] < last)
    per_kind = {}
    for c in chunks:
        inner = [a for a in reduces if a[1] >= c[1] and a[2] <= c[2]]
        per_kind.setdefault(f"{c[0]}{c[3]}", []).append(
            (round((c[2] - c[1]) * 1e3), round(sum(a[2] - a[1] for a in inner) * 1e3), len(inner)))
    median = sorted(a[2] - a[1] for a in reduces)[len(reduces) // 2] * 1e3 if reduces else 0.0
    return (last - start, sum(c[2] - c[1] for c in chunks), sum(a[2] - a[1] for a in reduces), len(reduces),
            median, waits, per_kind)


def main() -> None:
    folder = os.environ.get("PIPELINE_TRACE_DIR", "/tmp")
    ranks = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    for rank in range(ranks):
        with open(os.path.join(folder, f"trace-{rank}.json")) as f:
            events = json.load(f)
        starts = steps_of(events)
        for k in (-3, -2):
            span, busy, reduced, count, median, waits, per_kind = account(events, starts[k], starts[k + 1])
            step = starts[k + 1] - starts[k]
            print(f"rank {rank}: step {step:.3f} s = first F to last B {span:.3f} + after it {step - span:.3f} "
                  f"(stage sync, optimizer, loss, next batch); busy {busy:.3f} (TP all-reduces {reduced:.3f} in "
                  f"{count}, median {median:.1f} ms), waiting for transfers {waits:.3f}")
        print("    per chunk (ms, all-reduce ms, all-reduces):", per_kind)


if __name__ == "__main__":
    main()
