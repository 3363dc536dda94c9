"""Model profiles: what each cuttable piece of the model costs on this rank.

The step-time model (PARALLEL.md, "One cost model for everything") is built
from measured parts; this module measures the compute and memory part.  For
every piece of ``model.layer_modules()`` (embed, blocks, norm, head) it
records forward and backward seconds for ONE micro-batch, the bytes of its
parameters, gradients and AdamW state, and the bytes autograd saves for
backward per sample.  Times are this rank's real speed: on the emulator the
rank's cgroup CPU quota makes a slow rank measure slow, so nothing is scaled
by hand.

Exchanging profiles between ranks, caching them and overriding them from a
file live in :mod:`hcomm.parallel.profile_store`.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from hcomm.parallel.devices import local_device_name
from hcomm.settings import declare

# Also declared by hcomm.emulate.rankwrap, which sets it; read here.
HCOMM_EMU_MEMORY = declare("HCOMM_EMU_MEMORY", 0, "emulated device memory of this rank in bytes; its cgroup memory limit (set by hcomm emulate run)")

MiB = 1 << 20
GiB = 1 << 30
ADAMW_STATE_BYTES = 8   # exp_avg + exp_avg_sq, fp32, per parameter
MIN_ROUNDS = 3
# Time at least this long before stopping early: a mean over many of the
# emulator's 4-7 ms CFS periods (hcomm.emulate.cgroups) includes the throttling.
MIN_TIMED_S = 0.25
PRECISION = 0.02        # stop once the standard error of the mean round is below this fraction


@dataclass
class LayerCost:
    """One piece at one micro-batch of ``micro_batch`` samples of ``seq_len`` tokens."""
    name: str
    fwd_s: float
    bwd_s: float
    param_bytes: int
    grad_bytes: int
    optim_bytes: int            # AdamW, fp32 states: 2 per parameter
    act_bytes_per_sample: int   # saved for backward by this piece's forward
    # The part of fwd_s / bwd_s that does not shrink with fewer samples (kernel launches, Python,
    # small-matrix inefficiency), from a second profile at one sample (``with_fixed_costs``); 0 = unknown.
    fwd_fixed_s: float = 0.0
    bwd_fixed_s: float = 0.0

    def __post_init__(self):
        # A fixed part above the measured time makes the line fall with more samples, below 0 at large
        # micro-batches, and a pipeline of such pieces simulates to a 0 ms step: refuse it where it enters
        # (a profile file, a cache, a store exchange), not where the planner divides by it.
        for total, fixed, what in ((self.fwd_s, self.fwd_fixed_s, "forward"), (self.bwd_s, self.bwd_fixed_s, "backward")):
            if not (0.0 <= fixed <= total < math.inf):
                raise ValueError(f"piece {self.name!r}: {what} seconds must be finite with 0 <= fixed part <= "
                                 f"the measured time; got fixed {fixed!r} of {total!r}")

    def fwd_at(self, samples: float, measured: int) -> float:
        """Forward seconds at ``samples`` per micro-batch, from the profile's ``measured`` micro-batch:
        the fixed part plus the per-sample part scaled linearly."""
        return self.fwd_fixed_s + (self.fwd_s - self.fwd_fixed_s) * samples / measured

    def bwd_at(self, samples: float, measured: int) -> float:
        return self.bwd_fixed_s + (self.bwd_s - self.bwd_fixed_s) * samples / measured

    @classmethod
    def from_dict(cls, d: dict) -> "LayerCost":
        # Coerce: YAML 1.1 reads "1e-3" as a string, and hand-written files say 1 for 1.0.
        return cls(str(d["name"]), float(d["fwd_s"]), float(d["bwd_s"]), int(d["param_bytes"]),
                   int(d["grad_bytes"]), int(d["optim_bytes"]), int(d["act_bytes_per_sample"]),
                   float(d.get("fwd_fixed_s", 0.0)), float(d.get("bwd_fixed_s", 0.0)))


@dataclass
class DeviceProfile:
    rank: int
    device: str                 # device kind, see hcomm.parallel.devices
    micro_batch: int
    seq_len: int
    layers: List[LayerCost]
    memory_budget_bytes: int    # what a plan may use on this rank
    baseline_bytes: int         # what the process held before the model (see memory_budget)
    budget_source: str          # emulated | cuda-free | host-available
    seconds_spent: float        # obtaining this profile
    source: str                 # measured | cache | file
    compute_dtype: str = "fp32"  # measured under autocast in this dtype (hcomm.parallel.precision)

    @property
    def fwd_s(self) -> float:
        return sum(layer.fwd_s for layer in self.layers)

    @property
    def bwd_s(self) -> float:
        return sum(layer.bwd_s for layer in self.layers)

    def compute_s(self, samples: float) -> float:
        """Forward + backward seconds for `samples` samples.

        Assumes time is linear in the sample count, scaled from the measured
        micro-batch: true once a micro-batch fills the device (large matmuls),
        optimistic for batches far below the one measured, where fixed
        per-kernel costs dominate.
        """
        return (self.fwd_s + self.bwd_s) * samples / self.micro_batch

    @property
    def param_bytes(self) -> int:
        return sum(layer.param_bytes for layer in self.layers)

    @property
    def grad_bytes(self) -> int:
        return sum(layer.grad_bytes for layer in self.layers)

    @property
    def optim_bytes(self) -> int:
        return sum(layer.optim_bytes for layer in self.layers)

    def state_bytes(self, zero_fraction: float = 1.0) -> int:
        """Parameters + gradients + optimizer state held by this rank.

        `zero_fraction` is the share of all three it holds (ZeRO-3 with an
        uneven shard; 1.0 = replicated).  Stages 1 and 2 shard only part of
        the state: combine param_bytes, grad_bytes and optim_bytes for those.
        """
        return int((self.param_bytes + self.grad_bytes + self.optim_bytes) * zero_fraction)

    def activation_bytes(self, samples: float) -> int:
        return int(sum(layer.act_bytes_per_sample for layer in self.layers) * samples)

    def memory_needed(self, samples: float) -> int:
        """One replicated training step over `samples` samples held at once."""
        return self.state_bytes() + self.activation_bytes(samples)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def with_fixed_costs(self, one: "DeviceProfile") -> "DeviceProfile":
        """This profile with each piece's fixed cost, from ``one`` measured at one sample per micro-batch.

        A two-point line through t(1) and t(m): per-sample slope (t(m) - t(1)) / (m - 1), fixed part
        t(1) - slope, kept within [0, min(t(1), t(m))] against noise.  Pipelines run micro-batches far
        below the data-parallel profile's (on the CPU here the small model takes 47 ms per sample alone and
        31 ms per sample in fours: a linear scale-down misses a third).  A piece that ran slower at one
        sample than at m (4 ranks sharing 2 cores: a V100 block 2.49 ms at one sample, 0.86 ms at two)
        gets no per-sample part at all, not a negative one: its fixed part t(1) with a falling line
        predicted -0.78 ms at four samples, and a pipeline of such pieces simulated to a 0 ms step.
        """
        if one.micro_batch != 1 or self.micro_batch <= 1 or len(one.layers) != len(self.layers):
            raise ValueError(f"with_fixed_costs needs a profile at micro-batch 1 of the same pieces and this one "
                             f"above 1; got micro-batches {one.micro_batch} and {self.micro_batch}")
        m = self.micro_batch

        def fixed(t_m: float, t_1: float) -> float:
            slope = (t_m - t_1) / (m - 1)
            return min(max(t_1 - slope, 0.0), t_1, t_m)

        layers = [dataclasses.replace(c, fwd_fixed_s=fixed(c.fwd_s, c1.fwd_s), bwd_fixed_s=fixed(c.bwd_s, c1.bwd_s))
                  for c, c1 in zip(self.layers, one.layers)]
        return dataclasses.replace(self, layers=layers, seconds_spent=self.seconds_spent + one.seconds_spent)

    def slowed(self, factor: float) -> "DeviceProfile":
        """This profile with every piece's forward and backward ``factor`` times as long, fixed parts
        too (a slower device of the same kind, or one that drifted); its memory as is."""
        layers = [dataclasses.replace(c, fwd_s=c.fwd_s * factor, bwd_s=c.bwd_s * factor,
                                      fwd_fixed_s=c.fwd_fixed_s * factor, bwd_fixed_s=c.bwd_fixed_s * factor)
                  for c in self.layers]
        return dataclasses.replace(self, layers=layers)

    @classmethod
    def from_dict(cls, d: dict) -> "DeviceProfile":
        return cls(int(d["rank"]), str(d["device"]), int(d["micro_batch"]), int(d["seq_len"]),
                   [LayerCost.from_dict(layer) for layer in d["layers"]], int(d["memory_budget_bytes"]),
                   int(d["baseline_bytes"]), str(d["budget_source"]), float(d["seconds_spent"]), str(d["source"]),
                   str(d.get("compute_dtype", "fp32")))

    def __str__(self) -> str:
        lines = [f"rank {self.rank} {self.device} ({self.source}, {self.seconds_spent:.2f} s): "
                 f"micro-batch {self.micro_batch} x {self.seq_len} tokens",
                 f"{'piece':<12}{'fwd ms':>9}{'bwd ms':>9}{'params MiB':>12}{'act MiB/sample':>16}"]
        for layer in self.layers:
            lines.append(f"{layer.name:<12}{layer.fwd_s * 1e3:>9.2f}{layer.bwd_s * 1e3:>9.2f}"
                         f"{layer.param_bytes / MiB:>12.2f}{layer.act_bytes_per_sample / MiB:>16.2f}")
        lines.append(f"{'total':<12}{self.fwd_s * 1e3:>9.2f}{self.bwd_s * 1e3:>9.2f}"
                     f"{self.param_bytes / MiB:>12.2f}{self.activation_bytes(1) / MiB:>16.2f}")
        lines.append(f"budget {self.memory_budget_bytes / GiB:.2f} GiB ({self.budget_source}), "
                     f"baseline {self.baseline_bytes / MiB:.0f} MiB; one replicated step of a micro-batch needs "
                     f"{self.memory_needed(self.micro_batch) / MiB:.1f} MiB")
        return "\n".join(lines)


def format_profiles(profiles: Sequence[DeviceProfile]) -> str:
    """One table for all ranks."""
    header = (f"{'rank':>4}  {'device':<8}{'fwd ms':>9}{'bwd ms':>9}{'bwd/fwd':>9}{'samples/s':>11}"
              f"{'params MiB':>12}{'act MiB/sample':>16}{'budget GiB':>12}  source")
    lines = [header]
    for p in sorted(profiles, key=lambda p: p.rank):
        step = p.fwd_s + p.bwd_s
        lines.append(f"{p.rank:>4}  {p.device:<8}{p.fwd_s * 1e3:>9.2f}{p.bwd_s * 1e3:>9.2f}"
                     f"{p.bwd_s / p.fwd_s if p.fwd_s else 0.0:>9.2f}{p.micro_batch / step if step else 0.0:>11.1f}"
                     f"{p.param_bytes / MiB:>12.2f}{p.activation_bytes(1) / MiB:>16.2f}"
                     f"{p.memory_budget_bytes / GiB:>12.2f}  {p.source}")
    return "\n".join(lines)


# ---------------------------------------------------------------- memory budget

def _proc_kib(path: str, field: str) -> int:
    with open(path) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{path} has no {field} line")


def process_rss_bytes() -> int:
    """This process's resident memory now: record it at start as the baseline."""
    return _proc_kib("/proc/self/status", "VmRSS")


def memory_budget(baseline_bytes: Optional[int] = None) -> Tuple[int, int, str]:
    """(budget, baseline, source): the bytes a plan may use on this rank.

    Emulated: the cgroup limit (``HCOMM_EMU_MEMORY``) minus what the process
    already held before the model (the interpreter and torch) -- pass the
    RSS recorded at start as `baseline_bytes`, else it is read now.  CUDA:
    the device's free memory now (baseline: what is in use on it).  Else the
    host's MemAvailable (baseline: this process's RSS).
    """
    emulated = HCOMM_EMU_MEMORY.get()
    if emulated > 0:
        baseline = process_rss_bytes() if baseline_bytes is None else baseline_bytes
        return max(emulated - baseline, 0), baseline, "emulated"
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        return free, total - free, "cuda-free"
    baseline = process_rss_bytes() if baseline_bytes is None else baseline_bytes
    return _proc_kib("/proc/meminfo", "MemAvailable"), baseline, "host-available"


# ---------------------------------------------------------------- measuring

def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _piece_names(model: nn.Module, pieces: Sequence[nn.Module]) -> List[str]:
    names: Dict[int, str] = {id(module): name for name, module in model.named_modules()}
    return [names.get(id(piece), f"piece{i}") for i, piece in enumerate(pieces)]


def _new_params(piece: nn.Module, seen: set) -> List[nn.Parameter]:
    """Parameters of `piece` not already counted for an earlier piece (tied weights count once)."""
    fresh = [p for p in piece.parameters() if id(p) not in seen]
    seen.update(id(p) for p in fresh)
    return fresh


class _SavedBytes:
    """Bytes of the distinct storages autograd saves for backward, parameters excluded (and, under
    autocast, their low-precision copies: one per parameter per step, not per sample -- tensors of a
    parameter's shape in another dtype)."""

    def __init__(self, param_storages: set, param_shapes: Optional[set] = None):
        self.seen = set(param_storages)
        self.param_shapes = param_shapes or set()
        self.nbytes = 0

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if (tuple(tensor.shape), tensor.dtype) in self.param_shapes:
            return tensor
        if storage.data_ptr() not in self.seen:
            self.seen.add(storage.data_ptr())
            self.nbytes += storage.nbytes()
        return tensor


def _run_piece(piece: nn.Module, x: torch.Tensor, targets: torch.Tensor, is_head: bool) -> torch.Tensor:
    out = piece(x)
    if is_head:
        # The head's cost includes the loss (fp32 cross entropy, as the model's loss does):
        # its log-softmax over the vocabulary is a large part of both time and memory.
        return F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), targets.reshape(-1))
    return out


def measure(model: nn.Module, *, micro_batch: int, seq_len: int, vocab_size: int, rank: int = 0,
            device_name: Optional[str] = None, budget_s: float = 10.0,
            baseline_bytes: Optional[int] = None, compute_dtype: str = "fp32") -> DeviceProfile:
    """Profile every piece of ``model.layer_modules()`` on one micro-batch.

    A first forward pass through all pieces on random tokens captures each
    piece's real input and the bytes it saves for backward.  Then, per round,
    each piece is timed alone: ``out = piece(x)``, then ``out.backward(grad)``
    with a fixed random grad (the head: its loss's own grad).  One warm-up
    round, then rounds until the mean round time is known to 2% (standard
    error; after at least 3 rounds and 0.25 s), or until the next round
    would overrun `budget_s`: the budget wins over the minimum, and at least
    one round is always timed.  A busy box has noisy rounds and so spends
    more of the budget.

    Means, not medians: a rank slowed by a CPU quota runs at full speed
    until its quota is spent, then stalls for the rest of the period.  A
    piece shorter than the period mostly times fast, so its median would
    report full speed; the mean over many periods is the sustained speed.

    ``compute_dtype``: every piece runs under the autocast training uses for that dtype
    (``precision.Precision``), so ``--precision search`` can weigh a device's low precision against
    fp32 by measurement.

    Leaves every parameter's ``.grad`` None.
    """
    start = time.perf_counter()
    pieces = list(model.layer_modules())
    names = _piece_names(model, pieces)
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(0)  # leave the caller's RNG alone
    tokens = torch.randint(vocab_size, (micro_batch, seq_len), generator=gen).to(device)
    targets = torch.randint(vocab_size, (micro_batch, seq_len), generator=gen).to(device)
    last = len(pieces) - 1

    seen_params: set = set()
    piece_params = [_new_params(piece, seen_params) for piece in pieces]
    param_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    from hcomm.parallel.precision import TORCH_DTYPES, Precision

    autocast = Precision(compute_dtype, device_type=device.type).autocast
    low = TORCH_DTYPES.get(compute_dtype, torch.float32)
    copies = {(tuple(p.shape), low) for p in model.parameters()} if low != torch.float32 else set()
    saved = _SavedBytes(param_storages, copies)  # one across pieces: a tensor two pieces save counts once
    inputs, grads, act_bytes = [], [], []
    outs = []  # keeps every graph alive until all are counted, so no saved storage is freed and its address reused
    x = tokens
    for i, piece in enumerate(pieces):
        x = x if i == 0 else x.detach().requires_grad_()
        before = saved.nbytes
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t), autocast():
            outs.append(_run_piece(piece, x, targets, i == last))
        act_bytes.append(saved.nbytes - before)
        inputs.append(x)
        with torch.no_grad():
            grads.append(None if i == last else torch.randn(outs[-1].shape, generator=gen).to(outs[-1]))
        x = outs[-1].detach()
    del outs, x

    fwd: List[List[float]] = [[] for _ in pieces]
    bwd: List[List[float]] = [[] for _ in pieces]

    def one_round(record: bool) -> None:
        for i, piece in enumerate(pieces):
            _sync(device)
            t0 = time.perf_counter()
            with autocast():
                out = _run_piece(piece, inputs[i], targets, i == last)
            _sync(device)
            t1 = time.perf_counter()
            out.backward(grads[i])
            _sync(device)
            t2 = time.perf_counter()
            del out
            # Fresh gradients every round, as after zero_grad(set_to_none=True): memory stays flat.
            inputs[i].grad = None
            for p in piece.parameters():
                p.grad = None
            if record:
                fwd[i].append(t1 - t0)
                bwd[i].append(t2 - t1)

    one_round(record=False)
    timed_start = time.perf_counter()
    round_s: List[float] = []
    while True:
        round_start = time.perf_counter()
        one_round(record=True)
        now = time.perf_counter()
        round_s.append(now - round_start)
        if (len(round_s) >= MIN_ROUNDS and now - timed_start >= MIN_TIMED_S
                and statistics.stdev(round_s) / math.sqrt(len(round_s)) <= PRECISION * statistics.fmean(round_s)):
            break
        if now - start + round_s[-1] > budget_s:
            break

    layers = []
    for i, name in enumerate(names):
        params = piece_params[i]
        param_bytes = sum(p.numel() * p.element_size() for p in params)
        trainable = [p for p in params if p.requires_grad]
        layers.append(LayerCost(name, statistics.fmean(fwd[i]), statistics.fmean(bwd[i]), param_bytes,
                                sum(p.numel() * p.element_size() for p in trainable),
                                ADAMW_STATE_BYTES * sum(p.numel() for p in trainable),
                                act_bytes[i] // micro_batch))
    budget, baseline, budget_source = memory_budget(baseline_bytes)
    return DeviceProfile(rank, device_name or local_device_name(), micro_batch, seq_len, layers, budget,
                         baseline, budget_source, time.perf_counter() - start, "measured", compute_dtype)
