"""What every benchmark definition shares: dtypes, reduction ops, test patterns.

A definition (one per collective, in ``collectives.py``, ``uneven.py`` and
``p2p.py``) says, like an nccl-tests ``testColl``: how a requested size maps
to element counts, how to fill the inputs, how to run one call, how to count
wrong elements afterwards, and its bus-bandwidth factor.

The data check must be exact, so inputs are small integers that every dtype
represents exactly, and every partial result a reduction can form (whatever
order the algorithm adds in) stays exact too: then ``output != expected``
counts real errors, never rounding.
"""
from __future__ import annotations

import abc

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

# name printed in the table (nccl-tests spelling) -> torch dtype
DTYPES: Dict[str, torch.dtype] = {
    "float": torch.float32,
    "double": torch.float64,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
}
DTYPE_ALIASES = {
    "float32": "float", "fp32": "float", "f32": "float",
    "float64": "double", "fp64": "double", "f64": "double",
    "float16": "half", "fp16": "half", "f16": "half",
    "bf16": "bfloat16", "int": "int32", "long": "int64", "char": "int8",
}

REDOPS = {
    "sum": dist.ReduceOp.SUM,
    "prod": dist.ReduceOp.PRODUCT,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "avg": dist.ReduceOp.AVG,
}

# Largest integer L such that every integer in [0, L] is exact in the dtype.
_EXACT_LIMIT = {
    torch.float32: 2 ** 24, torch.float64: 2 ** 53, torch.float16: 2 ** 11,
    torch.bfloat16: 2 ** 8, torch.int8: 127, torch.uint8: 255,
    torch.int32: 2 ** 31 - 1, torch.int64: 2 ** 62, torch.bool: 1,
}
# Patterns never need more distinct values than this; a prime keeps the
# pattern from lining up with power-of-two chunk boundaries.
_MAX_MODULUS = 8191


def canonical_dtype(name: str) -> Optional[str]:
    name = name.strip().lower()
    name = DTYPE_ALIASES.get(name, name)
    return name if name in DTYPES else None


def redop_problem(dtype_name: str, redop: str) -> Optional[str]:
    """Why ``redop`` cannot be benchmarked on ``dtype_name`` (None if it can)."""
    dtype = DTYPES[dtype_name]
    if dtype == torch.bool and redop in ("sum", "prod", "avg"):
        return f"dtype bool cannot be used with op {redop} (only max/min are defined on bool)"
    if redop == "avg" and not dtype.is_floating_point:
        return f"dtype {dtype_name} cannot be used with op avg (integer averages truncate)"
    return None


def exact_limit(dtype: torch.dtype) -> int:
    return _EXACT_LIMIT[dtype]


def modulus_for(dtype: torch.dtype, largest_multiple: int) -> int:
    """Number of distinct base values m so that (m - 1) * largest_multiple is exact.

    ``largest_multiple`` is the largest factor any base value gets multiplied
    by in an input or a partial result.  m can fall to 1 (all zeros) for tiny
    dtypes on many ranks; the check then only proves "no garbage".
    """
    m = exact_limit(dtype) // max(1, largest_multiple) + 1
    return max(1, min(_MAX_MODULUS, m))


def hashed_pattern(start: int, count: int, modulus: int, device) -> torch.Tensor:
    """Pseudo-random values in [0, modulus) for global indices start..start+count.

    Multiplicative hashing (Knuth) rather than ``j % m`` so that two chunks
    of a power-of-two size never hold the same values: a collective that
    delivers the wrong chunk is caught, not just one that delivers garbage.
    Computed in int64: j * 2654435761 stays below 2**63 for j < 2**31.
    """
    j = torch.arange(start, start + count, dtype=torch.int64, device=device)
    return ((j * 2654435761) >> 13) % max(1, modulus)


def count_wrong(actual: torch.Tensor, expected: torch.Tensor) -> int:
    return int((actual != expected.to(actual.dtype)).sum().item())


@dataclass
class Context:
    """One rank's view of one benchmark case (one backend, one size)."""

    rank: int
    nranks: int
    dtype_name: str
    redop: str
    root: int
    device: torch.device
    backend: str
    group: Any = None

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.dtype_name]

    @property
    def elsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def torch_redop(self):
        return REDOPS[self.redop]


@dataclass
class Buffers:
    """The tensors of one case plus whatever a definition needs to check them."""

    inp: torch.Tensor
    out: torch.Tensor
    extra: Dict[str, Any] = field(default_factory=dict)


class Collective(abc.ABC):
    """Base for one benchmarked operation; subclasses fill in the hooks."""

    name = ""
    description = ""
    reduces = False      # takes --op
    has_root = False     # takes --root
    min_ranks = 1
    uneven = False       # a _v variant: hcomm direct API, torch reference for others
    hcomm_api: Optional[str] = None  # name of the hcomm.* function it needs
    time_divisor = 1     # ping-pong reports half a round trip

    # -- sizes -------------------------------------------------------------
    def granule(self, nranks: int) -> int:
        """Element counts are rounded to a multiple of this."""
        return 1

    def count_for(self, nbytes: int, elsize: int, nranks: int) -> int:
        """nccl-tests rounds a requested size down to whole granules (at least one)."""
        g = self.granule(nranks)
        return max(g, (nbytes // elsize) // g * g)

    @abc.abstractmethod
    def busbw_factor(self, nranks: int) -> float:
        ...

    # -- data --------------------------------------------------------------
    @abc.abstractmethod
    def prepare(self, ctx: Context, count: int) -> Buffers:
        """Allocate the buffers for ``count`` elements (the ``count`` column)."""
        ...

    @abc.abstractmethod
    def reset(self, ctx: Context, buf: Buffers) -> None:
        """(Re)write the inputs; called before the checked call."""
        ...

    @abc.abstractmethod
    def run(self, ctx: Context, buf: Buffers) -> None:
        """One synchronous call of the operation."""
        ...

    @abc.abstractmethod
    def wrong(self, ctx: Context, buf: Buffers) -> int:
        """Elements of this rank's result that differ from the exact answer."""
        ...

    def corrupt_target(self, buf: Buffers) -> torch.Tensor:
        """The tensor the corruption hook writes into (an input: the error must
        travel through the collective to be counted)."""
        return buf.inp

    def label(self, backend: str) -> Optional[str]:
        """An algorithm name known without asking hcomm (torch references)."""
        return None


# -- reduction patterns shared by all_reduce, reduce, reduce_scatter(_v) ------
# Rank r contributes (r + 1) * base[j]; the exact results are closed forms, so
# no rank has to materialise everyone's inputs to check its output.

def reduction_modulus(dtype: torch.dtype, redop: str, nranks: int) -> int:
    n = nranks
    if dtype == torch.bool:
        return 2
    if redop == "sum":
        return modulus_for(dtype, n * (n + 1) // 2)
    if redop == "avg":
        # the sum is formed first and the mean is a half-integer: one more bit
        return modulus_for(dtype, n * (n + 1))
    return modulus_for(dtype, n)  # max, min: inputs up to n * base


def reduction_input(rank: int, nranks: int, redop: str, dtype: torch.dtype,
                    start: int, count: int, device) -> torch.Tensor:
    if redop == "prod":
        # 2 at one rank per index, 1 elsewhere: every product is 1 or 2, exact
        # in every dtype, and still depends on the index and the rank.
        j = torch.arange(start, start + count, dtype=torch.int64, device=device)
        return torch.where((j + rank) % (nranks + 1) == 0, 2, 1).to(dtype)
    base = hashed_pattern(start, count, reduction_modulus(dtype, redop, nranks), device)
    if dtype == torch.bool:
        return base.to(dtype)  # max/min of identical bools: the values themselves
    return ((rank + 1) * base).to(dtype)


def reduction_expected(nranks: int, redop: str, dtype: torch.dtype,
                       start: int, count: int, device) -> torch.Tensor:
    n = nranks
    if redop == "prod":
        j = torch.arange(start, start + count, dtype=torch.int64, device=device)
        return torch.where(j % (n + 1) != 1, 2, 1).to(dtype)
    base = hashed_pattern(start, count, reduction_modulus(dtype, redop, n), device)
    if dtype == torch.bool:
        return base.to(dtype)
    if redop == "sum":
        return (base * (n * (n + 1) // 2)).to(dtype)
    if redop == "avg":
        return (base.to(torch.float64) * (n + 1) / 2).to(dtype)
    if redop == "max":
        return (base * n).to(dtype)
    return base.to(dtype)  # min: rank 0's (1 * base)


def movement_modulus(dtype: torch.dtype) -> int:
    return modulus_for(dtype, 1)


def movement_values(start: int, count: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Values for ops that only move data: element j of the global layout."""
    return hashed_pattern(start, count, movement_modulus(dtype), device).to(dtype)


def poison_like(values: torch.Tensor) -> torch.Tensor:
    """A buffer that differs from ``values`` everywhere (for receive buffers).

    -1 - v is negative where v >= 0 (and wraps to 255 - v for uint8), so it
    never equals v, even where it rounds in a narrow float type.
    """
    if values.dtype == torch.bool:
        return ~values
    return (-1 - values.to(torch.int64)).to(values.dtype)


def split_offsets(counts: List[int]) -> List[int]:
    offsets, acc = [], 0
    for c in counts:
        offsets.append(acc)
        acc += c
    return offsets
