"""Pipeline partitioning: which pieces each stage runs, and which device runs each stage.

Costs come from ``costs.PipelineCosts`` (one ``DeviceProfile`` per
stage device, link times, activation bytes per cut, memory budgets).

What is exact: ``partition`` searches ALL contiguous partitions (every stage
non-empty) and ALL device orders that fit memory, by branch and bound on the
step time ``schedule_cost.simulate`` predicts, pruning only with
``schedule_cost.lower_bound``'s terms (proven lower bounds of that time).  A
finished search (``Partition.exact``) means nothing is predicted faster, up
to a relative ``REL_TOL`` (float rounding).  Past the node budget
(``max_nodes``) the best found comes back with ``exact=False`` and ``gap``:
the most an unexplored partition could be faster.

- One stage per rank (GPipe, 1F1B): the bound terms are minimised over all
  completions by DP over (first piece, device class, devices left), i.e.
  (stage, first piece) with device subsets, Held-Karp style; a term that
  needs two sums of later stages takes each sum's own minimum, so the value
  is a bound, not always attained.  Its argmin is the first incumbent, and
  children go best bound first; on the cases tried the bound met the
  optimum and few partitions were simulated.
- Interleaved: a rank's stages are not contiguous, so completions are bounded
  by water-filling the remaining pieces' least work over the ranks: weaker,
  and big cases (many one-piece stages) may end on the budget.

Interchangeable devices (``costs.interchangeable``) form a class, so
equivalent orders are searched once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

from hcomm.parallel.pipeline.costs import (MiB, HostTime, LinkTime, LinksOf, PipelineCosts, interchangeable,
                                           prefix_sums)
from hcomm.parallel.pipeline.schedule_cost import Action, action_orders, lower_bound, path_terms, simulate

MAX_ORDER_DEVICES = 8
MAX_NODES = 200_000   # search budget, subtrees expanded: 10-20 s of pure Python at the worst
REL_TOL = 1e-9


@dataclass
class StagePlan:
    stage: int             # pipeline (virtual) stage; runs on pipeline position stage % ranks
    rank: int
    device: str
    first: int             # pieces [first, last)
    last: int
    fwd_s: float           # one micro-batch
    bwd_s: float
    send_s: float          # its activation to the next stage, one micro-batch (0 for the last)
    state_bytes: int       # parameters + gradients + AdamW state of its pieces
    activation_bytes: int  # its activations at its own peak of micro-batches in flight


@dataclass
class Partition:
    label: str             # "auto", "uniform", "parameters", "given"
    schedule: str
    micro_batches: int
    micro_batch: int       # samples per micro-batch
    virtual_stages: int
    stages: List[StagePlan]
    piece_names: List[str]
    step_s: float          # simulated
    busy_s: List[float]    # per pipeline position r (rank ``ranks[r]``)
    peak_in_flight: List[int]
    memory_bytes: List[int]
    budget_bytes: List[int]
    lower_bound_s: float   # for these cuts and order (schedule_cost.lower_bound)
    simulated: int = 1     # partitions the search simulated
    exact: bool = True     # the search finished: nothing is predicted faster (to REL_TOL)
    gap: float = 0.0       # otherwise: how much faster an unexplored partition could at most be

    @property
    def ranks(self) -> List[int]:
        return [st.rank for st in self.stages[:len(self.busy_s)]]

    @property
    def orders(self) -> List[List[Action]]:
        """Per pipeline position: what its runtime executes, in order (the schedule's own)."""
        return action_orders(self.schedule, len(self.busy_s), self.micro_batches, self.virtual_stages)

    @property
    def cuts(self) -> List[int]:
        return [st.first for st in self.stages] + [self.stages[-1].last]

    @property
    def fits(self) -> bool:
        return all(m <= b for m, b in zip(self.memory_bytes, self.budget_bytes))

    def layer_ranges(self) -> Dict[int, List[Tuple[int, int]]]:
        """rank -> its piece ranges, in stage order (one per virtual stage)."""
        out: Dict[int, List[Tuple[int, int]]] = {}
        for st in self.stages:
            out.setdefault(st.rank, []).append((st.first, st.last))
        return out

    def __str__(self) -> str:
        head = (f"pipeline {self.label}: {self.schedule}" + (f" x{self.virtual_stages}" if self.virtual_stages > 1 else "")
                + f", {self.micro_batches} micro-batches of {self.micro_batch}, predicted step {self.step_s * 1e3:.1f} ms "
                f"(bound {self.lower_bound_s * 1e3:.1f} ms, {self.simulated} simulated"
                + ("" if self.exact else f"; search budget spent, up to {self.gap:.1%} may be left") + ")"
                + ("" if self.fits else ", DOES NOT FIT MEMORY"))
        lines = [head, f"  {'stage':>5} {'rank':>4} {'device':<8} {'pieces':<26}{'fwd ms':>8}{'bwd ms':>8}"
                       f"{'send ms':>8}{'busy':>6}{'in flight':>10}{'MiB':>9}{'budget':>9}"]
        p = len(self.busy_s)
        for st in self.stages:
            names = self.piece_names[st.first] + ("" if st.last - st.first == 1 else f"..{self.piece_names[st.last - 1]}")
            row = (f"  {st.stage:>5} {st.rank:>4} {st.device:<8} {f'[{st.first},{st.last}) {names}':<26}"
                   f"{st.fwd_s * 1e3:>8.2f}{st.bwd_s * 1e3:>8.2f}{st.send_s * 1e3:>8.2f}")
            if st.stage < p:  # per-rank columns once, on the rank's first stage
                r = st.stage
                row += (f"{self.busy_s[r] / self.step_s if self.step_s else 0:>6.0%}{self.peak_in_flight[r]:>10}"
                        f"{self.memory_bytes[r] / MiB:>9.1f}{self.budget_bytes[r] / MiB:>9.1f}")
            lines.append(row)
        return "\n".join(lines)


# ---------------------------------------------------------------- one stage per rank: DP bounds

class _Tail(NamedTuple):
    """Least values over the ways to run pieces [i, n) on the remaining stages (one per rank),
    measured from the start of the first of them."""
    h: float      # largest bound term (lower_bound's stage, link and path terms)
    trip: float   # round trip: work + transfers of these stages
    fmax: float   # trip + (M-1) * largest forward          } GPipe: its forward phase,
    bmax: float   # trip + (M-1) * largest backward         } backward phase,
    gp: float     # trip + (M-1) * (largest f + largest b)  } and whole step
    cut: int      # the argmin of h ends this stage here
    cls: int      # and gives the next stage to this class


@dataclass(frozen=True)
class _Fixed:
    """What the stages already placed contribute to the bound."""
    A: float = 0.0            # their work + transfers: where the next stage's terms start
    pm: float = 0.0           # largest term they fix alone
    k1: float = -math.inf     # their path terms still waiting for the round trip X of the rest: k1 + X,
    k2: float = -math.inf     # and k2 + 2X
    fmax: float = 0.0         # largest forward and backward so far (GPipe)
    bmax: float = 0.0

    def then(self, M: int, w: float, f: float, b: float, cf: float, cb: float, one: float, two: float) -> "_Fixed":
        x = w + cf + cb
        return _Fixed(self.A + x, max(self.pm, self.A + M * w, self.A + w + max(M * cf + cb, cf + M * cb)),
                      max(self.k1 + x, self.A + x + one), max(self.k2 + 2 * x, self.A + 2 * x + two),
                      max(self.fmax, f), max(self.bmax, b))

    def bound(self, t: _Tail, M: int) -> float:
        out = max(self.pm, self.A + t.h, self.k1 + t.trip, self.k2 + 2 * t.trip)
        if t.gp > -math.inf:
            out = max(out, self.A + t.gp, self.A + t.trip + (M - 1) * (self.fmax + self.bmax),
                      self.A + t.fmax + (M - 1) * self.bmax, self.A + t.bmax + (M - 1) * self.fmax)
        return out


class _Search:
    """Branch and bound over device orders and cut points; ``best`` is (cuts, device per position)."""

    def __init__(self, pb: PipelineCosts, max_nodes: int, bound_only: bool = False):
        self.pb = pb
        # bound_only: leaves are ranked by the proven lower bound instead of a simulation (a large
        # cluster's long pipelines: a simulation per leaf costs ~20 ms there); the result is simulated once
        self.bound_only = bound_only
        # A fixed order is one class per position; else classes of interchangeable devices.
        self.classes = [[d] for d in pb.order] if pb.order is not None else interchangeable(pb)
        self.best_t, self.best = math.inf, None
        self.simulated = self.nodes = 0
        self.max_nodes, self.open_bound = max_nodes, math.inf   # open: least bound left unexplored
        self._g = lru_cache(maxsize=None)(self._g_uncached)

    def cutoff(self) -> float:
        return self.best_t * (1.0 - REL_TOL)

    def visit(self, bound: float) -> bool:
        """Whether to expand a subtree; past the budget it is only recorded as open."""
        if self.nodes >= self.max_nodes:
            self.open_bound = min(self.open_bound, bound)
            return False
        self.nodes += 1
        return True

    def rep(self, c: int, used: int = 0) -> int:
        return self.classes[c][used]

    def allowed(self, counts: Sequence[int], s: int) -> List[int]:
        if self.pb.order is not None:                      # position s may only take its own device
            return [s] if counts[s] else []
        return [c for c, k in enumerate(counts) if k]

    def pair(self, c: int, c2: int) -> Tuple[int, int]:
        """Two distinct devices of classes c and c2 (links depend only on the classes)."""
        return self.rep(c), self.rep(c2, 1 if c == c2 else 0)

    def leaf(self, cuts: Sequence[int], devs: Sequence[int]) -> None:
        pb = self.pb
        if any(m > pb.budget[devs[r]] for r, m in enumerate(pb.memory(cuts, devs))) \
                or pb.bound(cuts, devs) >= self.cutoff():
            return
        t = pb.bound(cuts, devs) if self.bound_only else pb.simulate(cuts, devs)
        self.simulated += not self.bound_only
        if t < self.best_t:
            self.best_t, self.best = t, (list(cuts), list(devs))

    def _g_uncached(self, i: int, c: int, counts: Tuple[int, ...]) -> _Tail:
        """``_Tail`` of pieces [i, n) with class c first and ``counts`` of each class after it."""
        pb, M = self.pb, self.pb.M
        left = sum(counts)
        s, d = pb.p - 1 - left, self.rep(c)
        gpipe = pb.schedule == "gpipe"
        inf = math.inf
        h = trip = fmax = bmax = gp_least = inf
        cut = cls = -1
        # the next stage's classes, what is left after each, and the two devices a link joins (none depends on e)
        nexts = [(c2, tuple(k - (j == c2) for j, k in enumerate(counts)), *self.pair(c, c2))
                 for c2 in self.allowed(counts, s + 1)] if left else []
        fd, bd, link, g, budget = pb.f[d], pb.b[d], pb.link, self._g, pb.budget[d]
        for e in ([pb.n] if left == 0 else range(i + 1, pb.n - left + 1)):
            if pb.mem(d, i, e, s) > budget:
                break                                      # memory only grows with more pieces
            f, b = fd[e] - fd[i], bd[e] - bd[i]
            w = fd[e] - fd[i] + bd[e] - bd[i]              # as pb.w: the same rounding as every other bound
            if left == 0:
                return _Tail(M * w, w, w + (M - 1) * f, w + (M - 1) * b,
                             w + (M - 1) * (f + b) if gpipe else -inf, e, -1)
            one, two = path_terms(pb.schedule, s, pb.p, M, f, b)
            for c2, rest, a, a2 in nexts:
                cf, cb = link(a, a2, e), link(a2, a, e)
                t = g(e, c2, rest)
                x = w + cf + cb
                xt = x + t.trip
                val = max(M * w, w + max(M * cf + cb, cf + M * cb), x + t.h, xt + one, 2 * xt + two)
                gp = -inf
                if gpipe:
                    gp = max(xt + (M - 1) * (f + b), x + t.gp, x + t.fmax + (M - 1) * b, x + t.bmax + (M - 1) * f)
                    val = max(val, gp)
                if val < h:
                    h, cut, cls = val, e, c2
                if xt < trip:
                    trip = xt
                fmax = min(fmax, max(xt + (M - 1) * f, x + t.fmax))
                bmax = min(bmax, max(xt + (M - 1) * b, x + t.bmax))
                if gp < gp_least:
                    gp_least = gp
        return _Tail(h, trip, fmax, bmax, gp_least, cut, cls)

    def _dfs_linear(self, s: int, i: int, c: int, counts: Tuple[int, ...], fixed: _Fixed,
                    cuts: List[int], devs: List[int], used: List[int]) -> None:
        """Stage s runs on class c from piece i; its children are visited best bound first."""
        pb, M = self.pb, self.pb.M
        d = self.rep(c, used[c])
        left = sum(counts)
        used[c] += 1
        devs.append(d)
        if left == 0:
            if pb.mem(d, i, pb.n, s) <= pb.budget[d]:
                self.leaf(cuts + [pb.n], devs)
        else:
            children = []
            for e in range(i + 1, pb.n - left + 1):
                w, f, b = pb.w(d, i, e), pb.f[d][e] - pb.f[d][i], pb.b[d][e] - pb.b[d][i]
                if pb.mem(d, i, e, s) > pb.budget[d] or max(fixed.pm, fixed.A + M * w) >= self.cutoff():
                    break                                  # both only grow with e
                one, two = path_terms(pb.schedule, s, pb.p, M, f, b)
                for c2 in self.allowed(counts, s + 1):
                    a, a2 = self.pair(c, c2)
                    nxt = fixed.then(M, w, f, b, pb.link(a, a2, e), pb.link(a2, a, e), one, two)
                    rest = tuple(k - (j == c2) for j, k in enumerate(counts))
                    bound = nxt.bound(self._g(e, c2, rest), M)
                    if bound < self.cutoff():
                        children.append((bound, e, c2, rest, nxt))
            children.sort(key=lambda ch: ch[:3])
            for bound, e, c2, rest, nxt in children:
                if bound >= self.cutoff() or not self.visit(bound):
                    break
                self._dfs_linear(s + 1, e, c2, rest, nxt, cuts + [e], devs, used)
        devs.pop()
        used[c] -= 1

    def linear(self) -> None:
        """One stage per rank: the DP's argmin first, then everything its bounds cannot rule out."""
        pb = self.pb
        counts = [len(cls) for cls in self.classes]
        roots = sorted((self._g(0, c, rest).h, c, rest) for c in self.allowed(counts, 0)
                       for rest in [tuple(k - (j == c) for j, k in enumerate(counts))])
        if not roots or roots[0][0] == math.inf:
            raise pb.infeasible()
        _, c, rest = roots[0]
        cuts, devs, used, i = [0], [], [0] * len(self.classes), 0
        while c >= 0:
            devs.append(self.rep(c, used[c]))
            used[c] += 1
            tail = self._g(i, c, rest)
            cuts.append(tail.cut)
            rest = tuple(k - (j == tail.cls) for j, k in enumerate(rest))
            i, c = tail.cut, tail.cls
        self.leaf(cuts, devs)
        for bound, c, rest in roots:
            if bound >= self.cutoff() or not self.visit(bound):
                break
            self._dfs_linear(0, 0, c, rest, _Fixed(), [0], [], [0] * len(self.classes))

    # --- interleaved: rank-load bounds -------------------------------------------------------

    def interleaved(self) -> None:
        pb = self.pb
        # ratio[d][i]: device d's least slowdown over the fastest device for any of pieces i..n-1,
        # so a rank on d spends at least ratio * least on whatever remaining pieces it gets.
        least = [min(pb.w(d, j, j + 1) for d in range(pb.p)) for j in range(pb.n)]
        self.rest_least = prefix_sums(least)
        self.ratio = []
        for d in range(pb.p):
            suffix = [math.inf] * (pb.n + 1)
            for j in range(pb.n - 1, -1, -1):
                suffix[j] = min(suffix[j + 1], pb.w(d, j, j + 1) / least[j] if least[j] > 0 else 1.0)
            self.ratio.append(suffix)
        # Seeds, so that pruning starts from a real time: on a few device orders, the cuts that
        # balance the slowest stage (a DP), and the two baselines' cuts.  Children are then visited
        # nearest that balanced stage time first.
        self.target = math.inf
        for devs in self._seed_orders():
            cuts, slowest = _balanced_cuts(pb, devs)
            self.target = min(self.target, slowest)
            for seed in ([cuts] if cuts else []) + _baseline_cuts(pb):
                self.leaf(seed, devs)
        p = pb.p
        self._dfs_inter(0, 0, [], [len(cls) for cls in self.classes], [0], [0.0] * p, [0] * p, [0] * p, [], 0.0, 0.0)

    def _seed_orders(self) -> List[List[int]]:
        """As given; else as listed, fastest first and slowest first."""
        pb = self.pb
        if pb.order is not None:
            return [list(pb.order)]
        total = [pb.w(d, 0, pb.n) for d in range(pb.p)]
        return [list(range(pb.p)), sorted(range(pb.p), key=lambda d: total[d]),
                sorted(range(pb.p), key=lambda d: -total[d])]

    def _fill(self, i: int, k: int, devs, counts, load, head, A: float) -> float:
        """Least possible max over ranks of (start + M * load) once pieces [i, n) are spread over the
        ranks with stages from k on: water-filling, each rank at its least slowdown."""
        pb = self.pb
        work = self.rest_least[pb.n] - self.rest_least[i]
        if work <= 0:
            return 0.0
        free = min((self.ratio[self.rep(c)][i] for c, m in enumerate(counts) if m), default=math.inf)
        levels = sorted(((head[r] if r < len(head) else A) + pb.M * load[r],
                         pb.M * (self.ratio[devs[r]][i] if r < len(devs) else free))
                        for r in range(pb.p) if (pb.v - 1) * pb.p + r >= k)  # ranks with a stage left
        inv = acc = 0.0   # raise the level tau until the ranks below it take the work: sum (tau-u)/slope = work
        for j, (u, slope) in enumerate(levels):
            inv, acc = inv + 1.0 / slope, acc + u / slope
            tau = (work + acc) / inv
            if j + 1 == len(levels) or tau <= levels[j + 1][0]:
                return tau
        return math.inf

    def _dfs_inter(self, k, i, devs, counts, cuts, load, state, act, head, A, pm) -> None:
        """Stage k from piece i.  Per position: load (work), state bytes, the largest single-stage
        activation bytes, head (work and transfers before its first stage); A before stage k."""
        pb, M, p = self.pb, self.pb.M, self.pb.p
        if k == pb.K:
            self.leaf(cuts, devs)
            return
        r, left = k % p, pb.K - k - 1
        children = []
        for c in (self.allowed(counts, k) if k < p else [None]):
            devs2, counts2 = devs, counts
            if c is not None:
                devs2 = devs + [self.rep(c, len(self.classes[c]) - counts[c])]
                counts2 = [m - (j == c) for j, m in enumerate(counts)]
            d, A2, pm2 = devs2[r], A, pm
            if k > 0:
                prev = devs2[(k - 1) % p]
                cf, cb = pb.link(prev, d, i), pb.link(d, prev, i)
                pm2, A2 = max(pm, A + max(M * cf + cb, cf + M * cb)), A + cf + cb
            head2 = head + [A2] if k < p else head
            for e in ([pb.n] if left == 0 else range(i + 1, pb.n - left + 1)):
                w = pb.w(d, i, e)
                st = state[r] + pb.state[d][e] - pb.state[d][i]
                a = max(act[r], (pb.act[d][e] - pb.act[d][i]) * pb.peak[k])
                own = max(pm2, head2[r] + M * (load[r] + w))
                if st + a > pb.budget[d] or own >= self.cutoff():
                    break                                  # both only grow with e
                load2 = load[:r] + [load[r] + w] + load[r + 1:]
                bound = max(own, self._fill(e, k + 1, devs2, counts2, load2, head2, A2 + w))
                if bound < self.cutoff():
                    children.append((abs(w - self.target), bound, e, devs2, counts2, load2,
                                     state[:r] + [st] + state[r + 1:], act[:r] + [a] + act[r + 1:], head2, A2 + w, own))
        children.sort(key=lambda ch: ch[:3])
        for n, (_, bound, e, *rest) in enumerate(children):
            if bound >= self.cutoff():
                continue                                   # not sorted by bound: look at them all
            if not self.visit(bound):
                self.open_bound = min([self.open_bound] + [ch[1] for ch in children[n:]])
                return
            devs2, counts2, load2, state2, act2, head2, A2, own = rest
            self._dfs_inter(k + 1, e, devs2, counts2, cuts + [e], load2, state2, act2, head2, A2, own)


def _balanced_cuts(pb: PipelineCosts, devs: Sequence[int]) -> Tuple[Optional[List[int]], float]:
    """Cuts minimising the slowest stage's forward+backward on these devices, each stage fitting memory
    on its own (DP over stage and first piece); (None, inf) if none does."""
    K, n, p = pb.K, pb.n, pb.p

    @lru_cache(maxsize=None)
    def best(k: int, i: int) -> Tuple[float, int]:
        d = devs[k % p]
        if k == K - 1:
            return (pb.w(d, i, n) if pb.mem(d, i, n, k) <= pb.budget[d] else math.inf), n
        out = (math.inf, -1)
        for e in range(i + 1, n - (K - k - 1) + 1):
            if pb.mem(d, i, e, k) > pb.budget[d]:
                break
            out = min(out, (max(pb.w(d, i, e), best(k + 1, e)[0]), e))
        return out

    if best(0, 0)[0] == math.inf:
        return None, math.inf
    cuts = [0]
    for k in range(K):
        cuts.append(best(k, cuts[-1])[1])
    return cuts, best(0, 0)[0]


def _baseline_cuts(pb: PipelineCosts) -> List[List[int]]:
    out = [parameter_cuts([c.param_bytes for c in pb.profiles[0].layers], pb.K)]   # K <= n: always possible
    return out + ([uniform_cuts(pb.n, pb.K)] if pb.n - 3 >= pb.K or pb.K == 1 else [])


# ---------------------------------------------------------------- public functions

def _result(pb: PipelineCosts, cuts: Sequence[int], devs: Sequence[int], label: str, simulated: int = 1) -> Partition:
    dev, fwd, bwd, cf, cb = pb.stage_costs(cuts, devs)
    sim = simulate(fwd, bwd, cf, pb.M, pb.schedule, pb.v, cb, channels=pb.channels(devs))
    stages = [StagePlan(k, pb.profiles[dev[k]].rank, pb.profiles[dev[k]].device, cuts[k], cuts[k + 1], fwd[k],
                        bwd[k], cf[k] if k < pb.K - 1 else 0.0,
                        pb.state[dev[k]][cuts[k + 1]] - pb.state[dev[k]][cuts[k]],
                        (pb.act[dev[k]][cuts[k + 1]] - pb.act[dev[k]][cuts[k]]) * pb.peak[k])
              for k in range(pb.K)]
    return Partition(label, pb.schedule, pb.M, pb.mb, pb.v, stages, list(pb.names), sim.step_s,
                     sim.busy_s, sim.peak_in_flight, pb.memory(cuts, devs),
                     [pb.budget[devs[r]] for r in range(pb.p)],
                     lower_bound(fwd, bwd, cf, pb.M, pb.schedule, pb.v, cb), simulated)



def partition(profiles: Sequence, *, micro_batches: int, micro_batch: int, schedule: str = "1f1b",
              virtual_stages: int = 1, boundary_bytes: Union[int, Sequence[int]] = 0,
              link_s: Optional[LinkTime] = None, budgets: Optional[Sequence[int]] = None,
              order: Optional[Sequence[int]] = None, max_nodes: int = MAX_NODES,
              bound_only: bool = False, host_s: Optional[HostTime] = None,
              links_of: Optional[LinksOf] = None) -> Partition:
    """The fastest contiguous partition and device order (the module docstring says what is exact).

    ``profiles``: one ``DeviceProfile`` per stage device; ``micro_batch``: samples per micro-batch;
    ``boundary_bytes``: activation bytes per sample leaving piece j (one value, or one per cut);
    ``link_s(rank_a, rank_b, nbytes)``: seconds to send nbytes from a to b (None: free links);
    ``host_s(rank_a, rank_b, nbytes)``: seconds each end of such a transfer spends on it (None: nothing);
    ``links_of(rank_a, rank_b)``: the links such a transfer occupies (None: its own per ordered pair);
    ``budgets``: bytes per device (default: each profile's memory budget); ``order``: which device
    (index into ``profiles``) runs each pipeline position, instead of searching; ``max_nodes``: the
    search budget.
    """
    if order is None and len(profiles) > MAX_ORDER_DEVICES:
        raise ValueError(f"the device-order search is exhaustive and limited to {MAX_ORDER_DEVICES} devices, got "
                         f"{len(profiles)}: pass order=[...] to fix which device runs each pipeline position")
    pb = PipelineCosts(profiles, micro_batches, micro_batch, schedule, virtual_stages, boundary_bytes, link_s, budgets, order,
                       host_s=host_s, links_of=links_of)
    search = _Search(pb, max_nodes, bound_only)
    search.linear() if pb.v == 1 else search.interleaved()
    if search.best is None:
        if search.open_bound < math.inf:
            raise ValueError(f"no partition that fits memory was found within max_nodes={max_nodes}; raise it")
        raise pb.infeasible()
    part = _result(pb, *search.best, "auto", simulated=search.simulated)
    if bound_only:   # every other partition simulates to at least its bound, and no bound was below ours
        part.exact, part.gap = False, max(0.0, 1.0 - min(search.best_t, search.open_bound) / part.step_s)
    elif search.open_bound < search.cutoff():
        part.exact, part.gap = False, 1.0 - search.open_bound / search.best_t
    return part


def evaluate(profiles: Sequence, cuts: Sequence[int], *, micro_batches: int, micro_batch: int, schedule: str = "1f1b",
             virtual_stages: int = 1, boundary_bytes: Union[int, Sequence[int]] = 0, link_s: Optional[LinkTime] = None,
             budgets: Optional[Sequence[int]] = None, order: Optional[Sequence[int]] = None,
             label: str = "given", host_s: Optional[HostTime] = None,
             links_of: Optional[LinksOf] = None) -> Partition:
    """The prediction for given cuts (``cuts[k]``: first piece of stage k, then the piece count) and device
    order (default: as listed).  Does not raise for memory: ``fits`` says whether it holds."""
    order = list(order) if order is not None else list(range(len(profiles)))
    pb = PipelineCosts(profiles, micro_batches, micro_batch, schedule, virtual_stages, boundary_bytes, link_s, budgets,
                       order, check_memory=False, host_s=host_s, links_of=links_of)
    cuts = list(cuts)
    if len(cuts) != pb.K + 1 or cuts[0] != 0 or cuts[-1] != pb.n or any(a >= b for a, b in zip(cuts, cuts[1:])):
        raise ValueError(f"cuts must rise from 0 to {pb.n} in {pb.K} non-empty stages, got {cuts}")
    return _result(pb, cuts, order, label)


def uniform_cuts(num_pieces: int, num_stages: int) -> List[int]:
    """Megatron-like: equal blocks per stage (the first stages take the remainder, as DeepSpeed's
    ``partition_uniform``), embed with the first stage, norm + head with the last.
    Pieces are [embed, block0..blockL-1, norm, head]."""
    blocks = num_pieces - 3
    if num_stages == 1:
        return [0, num_pieces]
    if blocks < num_stages:
        raise ValueError(f"a uniform split gives each of {num_stages} stages at least one block; the model has "
                         f"{max(blocks, 0)} blocks ({num_pieces} pieces)")
    per, extra = divmod(blocks, num_stages)
    cuts = [0, 1 + per + (extra > 0)]
    for s in range(1, num_stages - 1):
        cuts.append(cuts[-1] + per + (s < extra))
    return cuts + [num_pieces]


def parameter_cuts(param_bytes: Sequence[int], num_stages: int) -> List[int]:
    """DeepSpeed's ``partition_method='parameters'``: the least largest stage parameter count (exact,
    by DP), then each stage filled front to back up to it, as its ``_lprobe`` fills."""
    n = len(param_bytes)
    if num_stages > n:
        raise ValueError(f"{num_stages} stages but only {n} pieces")
    pre = prefix_sums(param_bytes)

    @lru_cache(maxsize=None)
    def least_max(i: int, s: int) -> int:
        if s == 1:
            return pre[n] - pre[i]
        return min(max(pre[e] - pre[i], least_max(e, s - 1)) for e in range(i + 1, n - s + 2))

    limit, cuts = least_max(0, num_stages), [0]
    for s in range(num_stages - 1, 0, -1):    # s stages after this one
        e = cuts[-1] + 1
        while e + 1 <= n - s and pre[e + 1] - pre[cuts[-1]] <= limit and least_max(e + 1, s) <= limit:
            e += 1
        cuts.append(e)
    return cuts + [n]


def uniform_partition(profiles: Sequence, **kw) -> Partition:
    """The Megatron-like baseline on the devices as listed (or ``order``); keywords as ``evaluate``."""
    cuts = uniform_cuts(len(profiles[0].layers), len(profiles) * kw.get("virtual_stages", 1))
    return evaluate(profiles, cuts, label="uniform", **kw)


def parameter_partition(profiles: Sequence, **kw) -> Partition:
    """The DeepSpeed parameter-count baseline on the devices as listed (or ``order``)."""
    cuts = parameter_cuts([c.param_bytes for c in profiles[0].layers], len(profiles) * kw.get("virtual_stages", 1))
    return evaluate(profiles, cuts, label="parameters", **kw)
