"""The joint search: every way to factor the cluster into pipelines, TP groups and data parallelism,
each built by its dimension's planner and judged by the one simulator.

For every (pipeline stages ``pp``, TP group size ``tp``) that divides the world and the model
(``pp`` at most the model's pieces, ``tp`` at most its key/value heads), the dimension's builder
chooses what it owns -- batch shares and buckets (``data``), shard fractions and layout (``zero``),
cuts, device order, schedule, micro-batches and rows (``pipeline``), uneven splits (``tensor``) --
and ``simulate`` predicts the plan's step and memory.  With ``pp = tp = 1`` data parallelism is tried
plain, as ZeRO 1, 2 and 3, with the weak tier compressed (when the view has that cost), and, only
when the caller allows asynchronous training, with an outer sync every H steps.  Plans that do not
fit memory are kept in the table with the ranks that overflow; the fastest that fits wins.

Objective: seconds per step; with ``prices`` (per device kind, any currency per hour) the cost per
million tokens is reported too and ranks the plans (every plan here runs on every device, so both
orders agree until plans that leave devices unlaunched exist).

The search runs on the view's profiles as they are, in one dtype per rank; ``planner.dtypes`` runs it
on each assignment of dtypes to device kinds when every rank also measured its low precision
(``--precision search``).  Not searched (stated in the result's notes): sequence parallelism (a memory
trade the cost model does not price yet).
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from hcomm.parallel.planner.pipeline import Effort
from hcomm.parallel.planner.simulate import Simulation, simulate


@dataclass
class Candidate:
    label: str
    plan: Optional[object] = None           # hcomm.parallel.Plan, None when the builder refused
    sim: Optional[Simulation] = None
    why_not: str = ""                        # the builder's refusal, or the ranks over budget
    variant_of: str = ""                     # the label of the candidate this one restricts (fewer micro-batches)

    @property
    def step_s(self) -> float:
        return self.sim.step_s if self.sim is not None else float("inf")

    @property
    def usable(self) -> bool:
        return self.sim is not None and self.sim.fits and not self.why_not


@dataclass
class SearchResult:
    best: Candidate
    candidates: List[Candidate]              # usable first, fastest first; then the refused
    seconds: float                           # the search's own time
    notes: List[str] = field(default_factory=list)

    def table(self, tokens_per_step: int, prices: Optional[Dict[str, float]] = None, devices=(),
              top: int = 12) -> List[str]:
        hourly = _hourly(prices, devices) if prices else None
        lines = [f"  {'':2}{'plan':<28}{'predicted ms':>13}{'tokens/s':>11}{'peak mem / budget':>19}"
                 + (f"{'cost/Mtok':>11}" if hourly else "")]
        for c in self.candidates[:top]:
            mark = "->" if c is self.best else "  "
            if c.sim is None:
                lines.append(f"  {mark}{c.label:<28}{'-':>13}{'-':>11}{'':>19}  refused: {c.why_not}")
                continue
            worst = max(range(len(c.sim.memory_bytes)), key=lambda r: c.sim.memory_bytes[r] / c.sim.budget_bytes[r])
            mem = f"{c.sim.memory_bytes[worst] / c.sim.budget_bytes[worst]:.0%} (rank {worst})"
            row = (f"  {mark}{c.label:<28}{c.step_s * 1e3:>13.1f}{tokens_per_step / c.step_s:>11,.0f}{mem:>19}"
                   + (f"{hourly * c.step_s / 3600 / tokens_per_step * 1e6:>11.4f}" if hourly else ""))
            lines.append(row + ("" if c.usable else f"  does not fit: {c.why_not}"))
        return lines


# Devices above which the pipeline search runs on a budget: 1F1B only, the largest micro-batch count
# of at least as many micro-batches as stages, partitions ranked by their proven lower bound and only
# the best simulated (a simulation costs ~20 ms for 32 stages x 128 micro-batches in Python), a node
# budget per partition search, the other replicas in the leader's device order (by class), and rows by
# throughput without a second prediction.
LARGE = 16
LARGE_EFFORT = Effort(max_nodes=300, schedules=("1f1b",), most_counts=1, bound_only=True, follow_leader=True,
                      refine_rows=False, leads=1)
# Up to LARGE devices every schedule and the two deepest micro-batch counts are tried, but the partition
# search per (schedule, count) stops after a few thousand nodes: the search plans ~15 shapes, and exact
# interleaved partitions of a 34-piece model over 8 stages cost minutes each (2 M nodes measured).
SMALL_EFFORT = Effort(max_nodes=5_000, most_counts=2)
# Up to FEW devices (a live job on one box, a node or two) every micro-batch count too: each message
# costs its two ends host time, so the fewest micro-batches can win (two-islands, pp=2: 2 interleaved
# micro-batches measured 740 ms, the deepest counts 850-960 ms).
FEW = 8
FEW_EFFORT = Effort(max_nodes=5_000)
# A pipeline's micro-batch count is where the simulator errs most: below the micro-batch the profiles
# were measured at, a piece's time comes from a line through two points (one sample and the profile's
# micro-batch), and one-sample micro-batches measured 12-24 % above their prediction on the emulator,
# micro-batches of the profile's size within 5 %.  Up to FEW devices a pipeline shape whose best plan
# runs micro-batches smaller than the profiles' is therefore offered twice: that plan, and its best
# with micro-batches at least the profiles' size, for the trial (``hcomm.train.trial``) to measure.


def coarser(label: str, most: int) -> str:
    """The label of ``label``'s variant of at most ``most`` micro-batches per replica."""
    return f"{label}, at most {most} micro-batch{'es' if most > 1 else ''}"


def _hourly(prices: Dict[str, float], devices: Sequence[str]) -> float:
    missing = sorted({d for d in devices if d not in prices})
    if missing:
        raise ValueError(f"prices name no price for device kind(s) {missing}; give one per kind")
    return sum(prices[d] for d in devices)


def _divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def shapes(world: int, n_pieces: int, kv_heads: int, max_tp: Optional[int] = None):
    """Every (pp, tp) the world and the model allow."""
    for tp in _divisors(world):
        if tp > kv_heads or (max_tp and tp > max_tp):
            continue
        for pp in _divisors(world // tp):
            if pp <= n_pieces:
                yield pp, tp


def search(view, global_batch: int, seq_len: int, *, dim: int, kv_heads: int, allow_async: bool = False,
           max_tp: Optional[int] = None, compressions: Sequence[str] = ("bf16",),
           prices: Optional[Dict[str, float]] = None) -> SearchResult:
    """The fastest plan that fits (see the module docstring); raises ValueError when none does, saying
    what the tightest candidate lacked."""
    from hcomm.parallel.planner.pipeline import boundary_bytes

    start = time.perf_counter()
    # Beyond a few dozen devices the pipeline partition search gets a node budget per (schedule, M):
    # every shape is still planned, and a partition that is not proven optimal says by how much at most.
    effort = FEW_EFFORT if view.world_size <= FEW else SMALL_EFFORT if view.world_size <= LARGE else LARGE_EFFORT
    n_pieces = len(view.profiles[0].layers)
    boundary = boundary_bytes(dim, seq_len)
    candidates: List[Candidate] = []

    def attempt(label: str, build, variant_of: str = "") -> Candidate:
        try:
            plan = build()
        except (ValueError, AssertionError) as error:   # the builder's own refusal: kept, with its words
            candidates.append(Candidate(label, why_not=str(error).splitlines()[0][:300], variant_of=variant_of))
            return candidates[-1]
        sim = simulate(plan, view, dim=dim)
        over = sim.over_budget()
        why = "" if not over else ", ".join(f"rank {r} needs {sim.memory_bytes[r] / 2**30:.2f} of "
                                            f"{sim.budget_bytes[r] / 2**30:.2f} GiB" for r in over[:3])
        plan.name = plan.name or label
        candidates.append(Candidate(label, plan, sim, why, variant_of))
        return candidates[-1]

    def pipeline(label: str, build) -> None:
        """``build(effort)``: the shape's best plan, then (up to FEW devices) its coarser variant."""
        best = attempt(label, lambda: build(effort))
        if effort is not FEW_EFFORT or best.plan is None:
            return
        counts = best.plan.samples_computed()
        groups = best.plan.pipeline_groups()
        most = max(g.micro_batches for g in groups)
        rows = max(counts[g.ranks[0]] for g in groups)
        measured = min(p.micro_batch for p in view.profiles)
        cap = max(1, rows // measured)
        if any(counts[g.ranks[0]] < measured * g.micro_batches for g in groups) and cap < most:
            fewer = dataclasses.replace(effort, max_micro_batches=cap)
            coarse = attempt(coarser(label, cap), lambda: build(fewer), variant_of=label)
            if coarse.plan is not None:
                coarse.plan.name = f"search {coarse.label}"

    for pp, tp in shapes(view.world_size, n_pieces, kv_heads, max_tp):
        if pp == 1 and tp == 1:
            _data_candidates(view, global_batch, seq_len, attempt, allow_async, compressions)
        elif tp == 1:
            from hcomm.parallel.planner.pipeline import plan_pipeline

            pipeline(f"pp={pp}", lambda effort, pp=pp: plan_pipeline(
                view, global_batch, seq_len, stages=pp, boundary=boundary, name=f"search pp={pp}", effort=effort))
        elif pp == 1:
            from hcomm.parallel.planner.tensor import plan_tensor

            attempt(f"tp={tp}", lambda tp=tp: plan_tensor(view, global_batch, seq_len, tp=tp, dim=dim,
                                                          n_layers=n_pieces - 3, name=f"search tp={tp}"))
        else:
            from hcomm.parallel.planner.pipeline_tensor import plan_pipeline_tensor

            pipeline(f"pp={pp} tp={tp}", lambda effort, pp=pp, tp=tp: plan_pipeline_tensor(
                view, global_batch, seq_len, stages=pp, tp=tp, dim=dim, boundary=boundary,
                name=f"search pp={pp} tp={tp}", effort=effort))
    hourly = _hourly(prices, view.devices) if prices else 1.0
    candidates.sort(key=lambda c: (not c.usable, c.sim is None, c.step_s * hourly))
    if not candidates or not candidates[0].usable:
        raise ValueError(_nothing_fits(candidates))
    result = SearchResult(candidates[0], candidates, time.perf_counter() - start)
    result.notes = describe(result, view)
    return result


def describe(result: SearchResult, view) -> List[str]:
    """The result's notes: what was searched and chosen, and the runners-up that can run."""
    return [f"searched {len(result.candidates)} plans over (pp, tp) shapes and data-parallel variants in "
            f"{result.seconds:.2f} s; chose {result.best.label}: {result.best.sim.account}",
            "dtypes: as profiled (" + dtypes_of(view) + "; --precision search weighs each kind's low precision "
            "by its profiles); not searched: sequence parallelism",
            *[f"runner-up {c.label}: {c.step_s * 1e3:.0f} ms ({c.step_s / result.best.step_s:.2f}x)"
              for c in result.candidates[1:6] if c.usable]]


def _data_candidates(view, global_batch: int, seq_len: int, attempt, allow_async: bool,
                     compressions: Sequence[str]) -> None:
    from hcomm.parallel.planner.data import plan_data_parallel
    from hcomm.parallel.planner.zero import apply_zero

    def data(**kw):
        return plan_data_parallel(view, global_batch, seq_len, **kw)[0]

    attempt("dp", lambda: data(name="search dp"))
    for stage in (1, 2, 3):
        def zero(stage=stage):
            plan = data(zero_stage=stage, name=f"search zero-{stage}")
            apply_zero(plan, view, stage, "auto")
            return plan
        attempt(f"zero-{stage}", zero)
    if len(view.islands) > 1:
        for c in compressions:
            if c in view.compressed_allreduce_s:
                attempt(f"dp, weak tier {c}", lambda c=c: data(compression=c, name=f"search dp {c}"))
        if allow_async:
            for h in (4, 8):
                attempt(f"dp, islands sync every {h}", lambda h=h: data(sync_every=h, name=f"search dp H={h}"))


def dtypes_of(view) -> str:
    """"A100 fp32, V100 fp16": the dtype each kind's profiles were measured in."""
    seen: Dict[str, str] = {}
    for kind, profile in zip(view.devices, view.profiles):
        seen.setdefault(kind, getattr(profile, "compute_dtype", "fp32"))
    return ", ".join(f"{k} {d}" for k, d in seen.items())


def _nothing_fits(candidates: List[Candidate]) -> str:
    built = [c for c in candidates if c.sim is not None]
    if not built:
        reasons = "; ".join(f"{c.label}: {c.why_not}" for c in candidates[:6])
        return f"no plan fits the model on this cluster: every builder refused ({reasons})"
    tightest = min(built, key=lambda c: max(m / b for m, b in zip(c.sim.memory_bytes, c.sim.budget_bytes)))
    r = max(range(len(tightest.sim.memory_bytes)),
            key=lambda i: tightest.sim.memory_bytes[i] / tightest.sim.budget_bytes[i])
    return (f"no plan fits the model on this cluster: the one needing least ({tightest.label}) still needs "
            f"{tightest.sim.memory_bytes[r] / 2**30:.2f} GiB on rank {r}, which has "
            f"{tightest.sim.budget_bytes[r] / 2**30:.2f} GiB")
