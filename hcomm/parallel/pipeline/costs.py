"""The costs a pipeline partition search reads: every (device, piece range) and link at one micro-batch
size, from the devices' profiles (``PipelineCosts``), and which devices can swap places without changing
any of them (``interchangeable``).  The step itself is ``schedule_cost.simulate``'s."""
from __future__ import annotations

from typing import Callable, Dict, Hashable, List, Optional, Sequence, Tuple, Union

from hcomm.parallel.pipeline.schedule_cost import check_schedule, lower_bound, simulate, standard

MiB = 1 << 20
LinkTime = Callable[[int, int, int], float]   # (rank_a, rank_b, nbytes) -> seconds to send from a to b
HostTime = Callable[[int, int, int], float]   # (rank_a, rank_b, nbytes) -> seconds a's end spends on that message
LinksOf = Callable[[int, int], Tuple[Hashable, ...]]   # (rank_a, rank_b) -> the links a transfer from a to b occupies


class PipelineCosts:
    """Validated inputs, and the cost of every (device, piece range) and link at one micro-batch size.

    ``profiles``: one ``DeviceProfile`` per stage device (pieces = ``model.layer_modules()``); times
    scale from each profile's measured ``micro_batch`` to ``micro_batch`` samples by
    ``LayerCost.fwd_at``/``bwd_at`` (linear in samples above each piece's fixed cost, where known).  A candidate is ``cuts`` (``cuts[k]``: first piece of stage k,
    then the piece count) and ``devs`` (``devs[r]``: index into ``profiles`` of pipeline position r);
    stage k runs on position ``k % ranks``.  Memory of a position: parameters, gradients and AdamW
    state of its pieces, plus activation bytes per sample x micro-batch x micro-batches in flight at
    its peak (from the schedule's order); input buffers and workspace are not modelled.
    """

    def __init__(self, profiles: Sequence, micro_batches: int, micro_batch: int, schedule: str = "1f1b",
                 virtual_stages: int = 1, boundary_bytes: Union[int, Sequence[int]] = 0, link_s: Optional[LinkTime] = None,
                 budgets: Optional[Sequence[int]] = None, order: Optional[Sequence[int]] = None, check_memory: bool = True,
                 host_s: Optional[HostTime] = None, links_of: Optional[LinksOf] = None):
        p = len(profiles)
        if p < 1:
            raise ValueError("a pipeline needs at least one stage device")
        check_schedule(schedule, micro_batches, p, virtual_stages)
        if micro_batch < 1:
            raise ValueError(f"micro_batch must be >= 1 sample, got {micro_batch}")
        names = [c.name for c in profiles[0].layers]
        for q in profiles[1:]:
            if [c.name for c in q.layers] != names:
                raise ValueError(f"rank {q.rank} ({q.device}) profiles pieces {[c.name for c in q.layers]}; "
                                 f"rank {profiles[0].rank} profiles {names}")
        n, K = len(names), p * virtual_stages
        if K > n:
            raise ValueError(f"{K} pipeline stages ({p} devices x {virtual_stages} per device) but the model has only "
                             f"{n} pieces; every stage needs at least one")
        self.boundary = [int(boundary_bytes)] * (n - 1) if isinstance(boundary_bytes, int) else list(boundary_bytes)
        if len(self.boundary) != n - 1:
            raise ValueError(f"boundary_bytes: {n} pieces have {n - 1} cuts, got {len(self.boundary)} values")
        self.budget = [int(b) for b in (budgets if budgets is not None else [q.memory_budget_bytes for q in profiles])]
        if len(self.budget) != p:
            raise ValueError(f"{p} stage devices but {len(self.budget)} memory budgets")
        if order is not None and sorted(order) != list(range(p)):
            raise ValueError(f"order must list each of the {p} stage devices (0..{p - 1}) once, got {list(order)}")
        self.profiles, self.names, self.p, self.n, self.K = list(profiles), names, p, n, K
        self.M, self.mb, self.schedule, self.v = micro_batches, micro_batch, schedule, virtual_stages
        self.order = list(order) if order is not None else None
        self.link_fn = link_s or (lambda a, b, nbytes: 0.0)
        self.host_fn = host_s or (lambda a, b, nbytes: 0.0)
        self.links_of = links_of
        self.orders = standard(schedule, p, micro_batches, virtual_stages)
        self.peak = self.orders.stage_peak(K)       # per stage: micro-batches in flight at its peak
        self.f, self.b, self.state, self.act = [], [], [], []
        for q in profiles:
            self.f.append(prefix_sums([c.fwd_at(micro_batch, q.micro_batch) for c in q.layers]))
            self.b.append(prefix_sums([c.bwd_at(micro_batch, q.micro_batch) for c in q.layers]))
            self.state.append(prefix_sums([c.param_bytes + c.grad_bytes + c.optim_bytes for c in q.layers]))
            self.act.append(prefix_sums([c.act_bytes_per_sample * micro_batch for c in q.layers]))
        self._links: Dict[Tuple[int, int, int], float] = {}
        self._hosts: Dict[Tuple[int, int, int], float] = {}
        if check_memory:
            self._check_one_piece_fits()

    def w(self, d: int, i: int, e: int) -> float:
        return self.f[d][e] - self.f[d][i] + self.b[d][e] - self.b[d][i]

    def link(self, a: int, b: int, cut: int) -> float:
        """Seconds to send one micro-batch's tensor at ``cut`` (the next stage's first piece) from a to b."""
        key = (a, b, self.boundary[cut - 1] * self.mb)
        if key not in self._links:
            ranks = (self.profiles[a].rank, self.profiles[b].rank)
            self._links[key] = 0.0 if a == b else float(self.link_fn(*ranks, key[2]))
        return self._links[key]

    def mem(self, d: int, i: int, e: int, stage: int) -> int:
        return self.state[d][e] - self.state[d][i] + (self.act[d][e] - self.act[d][i]) * self.peak[stage]

    def _check_one_piece_fits(self) -> None:
        for d in range(self.p):
            pos = self.order.index(d) if self.order is not None else d
            least = min(self.peak[pos::self.p] if self.order is not None else self.peak)
            need, j = min((self.state[d][j + 1] - self.state[d][j] + (self.act[d][j + 1] - self.act[d][j]) * least, j)
                          for j in range(self.n))
            if need > self.budget[d]:
                q = self.profiles[d]
                raise ValueError(f"stage {pos} (rank {q.rank}, {q.device}): the smallest piece ({self.names[j]}) needs "
                                 f"{need / MiB:.1f} MiB with {least} micro-batch(es) of {self.mb} in flight, budget "
                                 f"{self.budget[d] / MiB:.1f} MiB")

    def infeasible(self) -> ValueError:
        return ValueError(f"no partition of the {self.n} pieces over {self.K} stages fits memory with {self.schedule}, "
                          f"{self.M} micro-batches of {self.mb}: parameters+gradients+AdamW state total "
                          f"{self.state[0][-1] / MiB:.1f} MiB and activations {self.act[0][-1] / MiB:.1f} MiB per "
                          f"micro-batch (times those in flight), against budgets of "
                          f"{', '.join(f'{b / MiB:.1f}' for b in self.budget)} MiB")

    # --- one complete candidate: cuts[k] = first piece of stage k; devs[r] = device at position r ---

    def stage_costs(self, cuts: Sequence[int], devs: Sequence[int]):
        dev = [devs[k % self.p] for k in range(self.K)]
        fwd = [self.f[dev[k]][cuts[k + 1]] - self.f[dev[k]][cuts[k]] for k in range(self.K)]
        bwd = [self.b[dev[k]][cuts[k + 1]] - self.b[dev[k]][cuts[k]] for k in range(self.K)]
        cf = [self.link(dev[k], dev[k + 1], cuts[k + 1]) for k in range(self.K - 1)]
        cb = [self.link(dev[k + 1], dev[k], cuts[k + 1]) for k in range(self.K - 1)]
        # each message: the sender's and the receiver's own time (the partition search's partial bounds
        # leave it out, so they stay lower bounds and the search stays exact)
        for k in range(self.K - 1):
            if dev[k] != dev[k + 1]:
                here, there = self.host(dev[k], dev[k + 1], cuts[k + 1]), self.host(dev[k + 1], dev[k], cuts[k + 1])
                fwd[k] += here        # F(k) sends its output, F(k + 1) receives it
                fwd[k + 1] += there
                bwd[k + 1] += there   # B(k + 1) sends the input gradient, B(k) receives it
                bwd[k] += here
        return dev, fwd, bwd, cf, cb

    def host(self, a: int, b: int, cut: int) -> float:
        """Seconds device a's end of a transfer at ``cut`` between devices a and b takes of a's time (the
        sender's and the receiver's alike; each end at its own host's pace)."""
        key = (a, b, self.boundary[cut - 1] * self.mb)
        if key not in self._hosts:
            self._hosts[key] = float(self.host_fn(self.profiles[a].rank, self.profiles[b].rank, key[2]))
        return self._hosts[key]

    def memory(self, cuts: Sequence[int], devs: Sequence[int]) -> List[int]:
        p = self.p
        act = [self.act[devs[k % p]][cuts[k + 1]] - self.act[devs[k % p]][cuts[k]] for k in range(self.K)]
        peaks = self.orders.weighted_peak(act)
        return [int(peaks[r]) + sum(self.state[devs[r]][cuts[k + 1]] - self.state[devs[r]][cuts[k]]
                                    for k in range(r, self.K, p)) for r in range(p)]

    def channels(self, devs: Sequence[int]) -> Optional[Callable[[int, int], Tuple[Hashable, ...]]]:
        """``simulate``'s channels for positions ``devs`` (None: one per ordered pair).  A lower bound that
        ignores the sharing stays a lower bound: sharing links only delays transfers."""
        if self.links_of is None:
            return None
        ranks = [self.profiles[d].rank for d in devs]
        memo: Dict[Tuple[int, int], Tuple[Hashable, ...]] = {}   # a simulation asks per transfer, p^2 pairs

        def links(src: int, dst: int) -> Tuple[Hashable, ...]:
            key = (src, dst)
            if key not in memo:
                memo[key] = self.links_of(ranks[src], ranks[dst])
            return memo[key]
        return links

    def bound(self, cuts: Sequence[int], devs: Sequence[int]) -> float:
        _, fwd, bwd, cf, cb = self.stage_costs(cuts, devs)
        return lower_bound(fwd, bwd, cf, self.M, self.schedule, self.v, cb)

    def simulate(self, cuts: Sequence[int], devs: Sequence[int]) -> float:
        _, fwd, bwd, cf, cb = self.stage_costs(cuts, devs)
        return simulate(fwd, bwd, cf, self.M, self.schedule, self.v, cb, channels=self.channels(devs)).step_s


def prefix_sums(values: Sequence[float]) -> list:
    """[0, v0, v0+v1, ...]: the cost of pieces [i, e) is out[e] - out[i]."""
    out = [0]
    for x in values:
        out.append(out[-1] + x)
    return out


def interchangeable(costs: PipelineCosts) -> List[List[int]]:
    """Classes of devices (indices into the profiles) any two of which can swap places in any
    pipeline without changing any cost: same per-piece costs and budget, same links to every other
    device (and both ways between them), the same shared links to every other device (``links_of``:
    two devices of one island, not one of each).  Swaps compose, so each class is closed under them."""
    def link(x: int, y: int, j: int):   # what a transfer costs on the wire and each end's host
        return costs.link(x, y, j), costs.host(x, y, j), costs.host(y, x, j)

    byte_cuts = list({costs.boundary[j - 1]: j for j in range(1, costs.n)}.values())  # a cut per distinct size
    rank = [q.rank for q in costs.profiles]

    def shared(x: int, y: int):
        """The links a transfer from device x to y shares with others (None: only its own pair's)."""
        links = costs.links_of(rank[x], rank[y])
        return None if links == ((rank[x], rank[y]),) else links

    def swappable(a: int, b: int) -> bool:
        if any(x[a] != x[b] for x in (costs.f, costs.b, costs.state, costs.act, costs.budget)):
            return False
        if costs.links_of is not None and any((shared(a, c), shared(c, a)) != (shared(b, c), shared(c, b))
                                              for c in range(costs.p) if c not in (a, b)):
            return False
        return all(link(a, b, j) == link(b, a, j) and
                   all((link(a, c, j), link(c, a, j)) == (link(b, c, j), link(c, b, j))
                       for c in range(costs.p) if c not in (a, b)) for j in byte_cuts)

    classes: List[List[int]] = []
    for d in range(costs.p):
        home = next((cls for cls in classes if swappable(cls[0], d)), None)
        if home is None:
            classes.append([d])
        else:
            home.append(d)
    return classes
