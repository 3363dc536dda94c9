"""Cases for the tensor-parallel tests, run on every rank of a "groups" pool (tests/helpers/mp.py).

Each case cuts a model built from a fixed seed into this rank's shard over the pool's ranks
[0, k) and returns what the test compares with the single-process model, computed in the test
process from the same builder and batches (``reference``).

Models: the ``tiny`` config (dim 128, 4 blocks, SwiGLU hidden 352) with the 97-token vocabulary
and 16-token rows of the data-parallel tests (tests/parallel/dp_cases.py), and variants of it:
grouped-query attention (2 or 4 key/value heads) and 8 heads (so 3 ranks can hold 1:2:5 of them).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Dict, List, Optional, Sequence

import torch

from tests.parallel import dp_cases

VOCAB = dp_cases.VOCAB   # 97: not a multiple of the 64-row vocabulary unit, so rows split one by one
SEQ = dp_cases.SEQ       # 16
BATCH = 4                # rows per step (every rank of the TP group runs all of them)
LR = 0.5
STEPS = 3
SEED = 7

CONFIGS = {
    "tiny": {},
    "gqa2": dict(n_kv_heads=2),                 # 4 query heads over 2 key/value heads
    "gqa4x8": dict(n_heads=8, n_kv_heads=4),    # 8 query heads over 4 key/value heads, head dim 16
    "heads8": dict(n_heads=8),                  # 8 heads of 16: enough for 1:2:5 on 3 ranks
}


def config(name: str):
    from hcomm.models import get_config

    return dataclasses.replace(get_config("tiny"), max_seq_len=32, **CONFIGS[name])


def build(name: str):
    from hcomm.models import build_model

    return build_model(config(name), vocab_size=VOCAB, seed=SEED)


def rows(step: int) -> torch.Tensor:
    return dp_cases.batches(BATCH).global_batch_rows(step)


@functools.lru_cache(maxsize=None)
def reference(name: str, steps: int = STEPS):
    """Single process: per-step mean loss, the gradients of step 0, the parameters after ``steps`` SGD steps."""
    model = build(name)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses, grads0 = [], None
    for step in range(steps):
        opt.zero_grad()
        loss = model.loss(rows(step), reduction="mean")
        loss.backward()
        if step == 0:
            grads0 = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        opt.step()
        losses.append(float(loss.detach()))
    return losses, grads0, {n: p.detach().clone() for n, p in model.named_parameters()}


def shard_slice(name: str, cfg, split: Dict[str, List[int]], index: int):
    """(dim, start, size) of the full parameter ``name`` that shard ``index`` holds, or None (held whole).

    Derived here from the split, not read from the layers, so a layer that cut the wrong rows fails."""
    def span(sizes, scale=1):
        return sum(sizes[:index]) * scale, sizes[index] * scale

    hd = cfg.head_dim
    leaf = name.split(".")
    if name in ("embed.weight", "head.weight"):
        return (0, *span(split["vocab"]))
    if "attn" in leaf:
        proj = leaf[-2]
        if proj == "wq":
            return (0, *span(split["q_heads"], hd))
        if proj in ("wk", "wv"):
            return (0, *span(split["kv_heads"], hd))
        if proj == "wo":
            return (1, *span(split["q_heads"], hd))
    if "ffn" in leaf:
        return (1 if leaf[-2] == "w2" else 0, *span(split["hidden"]))
    assert "norm" in name, name   # attn_norm, ffn_norm, norm: whole on every rank
    return None


def cut(full: torch.Tensor, where) -> torch.Tensor:
    return full if where is None else full.narrow(*where)


# ------------------------------------------------------------------ cases

def _group(ctx, k: int, backend: str):
    gloo, hcomm_group = ctx.groups[k]
    return gloo if backend == "gloo" else hcomm_group


def case_train(ctx, k: int, name: str, fractions: Sequence[float], backend: str = "gloo", steps: int = STEPS,
               sequence_parallel: bool = False, reverse: bool = False):
    """Shard ``name`` over ranks [0, k) with ``fractions``; run ``steps`` SGD steps on the whole batch.
    ``reverse``: group rank r holds shard k-1-r (a plan that lists the fastest rank first).

    Returns on the group's ranks: the split, per-step losses, the step-0 gradients and the final
    parameters by name (this rank's shard), and the shard index; None elsewhere."""
    from hcomm.parallel.tensor.parallelize import tensor_parallelize

    if not ctx.in_group(k):
        return None
    group = _group(ctx, k, backend)
    shard_ranks = [k - 1 - p for p in range(k)] if reverse else list(range(k))
    index = shard_ranks.index(ctx.rank)
    tp = tensor_parallelize(build(name), group, list(fractions), index=index, sequence_parallel=sequence_parallel,
                            shard_ranks=shard_ranks)
    opt = torch.optim.SGD(tp.parameters(), lr=LR)
    losses, grads0 = [], None
    for step in range(steps):
        opt.zero_grad()
        loss = tp.loss(rows(step), reduction="mean")
        loss.backward()
        if step == 0:
            grads0 = {n: p.grad.detach().clone() for n, p in tp.named_parameters()}
        opt.step()
        losses.append(float(loss.detach()))
    split = dataclasses.asdict(tp.split)
    return split, losses, grads0, {n: p.detach().clone() for n, p in tp.named_parameters()}, index


def ce_logits(n_vocab: int):
    """Logits [24, V] and targets: every rank's first and last vocabulary row (boundaries), 0 and V-1,
    then random ones; rows 20..23 scaled x50 and shifted by +-1000 (a max-subtraction that matters)."""
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(24, n_vocab, generator=g, dtype=torch.float32) * 3
    logits[20:] = logits[20:] * 50 + torch.tensor([[1000.0], [-1000.0], [0.0], [500.0]])
    return logits


def ce_targets(sizes: Sequence[int]) -> torch.Tensor:
    n_vocab = sum(sizes)
    edges = []
    start = 0
    for s in sizes:
        edges += [start, start + s - 1]
        start += s
    g = torch.Generator().manual_seed(6)
    more = torch.randint(0, n_vocab, (24 - len(edges),), generator=g).tolist()
    return torch.tensor(edges + more, dtype=torch.long)


def case_cross_entropy(ctx, k: int, sizes: Sequence[int], backend: str):
    """vocab_parallel_cross_entropy over ranks [0, k), rank r holding ``sizes[r]`` vocabulary rows:
    (mean loss, sum loss, this rank's gradient of the mean loss, of 3 * the sum loss)."""
    from hcomm.parallel.tensor.vocab import vocab_parallel_cross_entropy

    if not ctx.in_group(k):
        return None
    group = _group(ctx, k, backend)
    start = sum(sizes[:ctx.rank])
    full = ce_logits(sum(sizes))
    targets = ce_targets(sizes)
    out = []
    for reduction, weight in (("mean", 1.0), ("sum", 3.0)):
        local = full[:, start:start + sizes[ctx.rank]].clone().requires_grad_(True)
        # as the model calls it: [B, S, V_local] logits and [B, S] targets
        loss = vocab_parallel_cross_entropy(local.view(4, 6, -1), targets.view(4, 6), start, group, reduction)
        (loss * weight).backward()
        out += [float(loss.detach()), local.grad.clone()]
    return out[0], out[2], out[1], out[3]


def case_bad_input(ctx):
    """Every refused input on ranks [0, 2) (and [0, 3) for more ranks than key/value heads): the
    ValueError's message, or None if nothing was raised.  Nothing here talks to the group."""
    from hcomm.parallel.tensor.parallelize import tensor_parallelize

    out: Dict[str, Optional[str]] = {}

    def attempt(label, make, group, fractions, **kw):
        try:
            tensor_parallelize(make(), group, fractions, **kw)
            out[label] = None
        except ValueError as error:
            out[label] = str(error)

    if ctx.in_group(2):
        g2 = ctx.groups[2][0]
        tiny = functools.partial(build, "tiny")
        attempt("fractions not summing to 1", tiny, g2, [0.6, 0.6])
        attempt("a zero fraction", tiny, g2, [1.0, 0.0])
        attempt("wrong fraction count", tiny, g2, [1.0])
        attempt("three fractions for two ranks", tiny, g2, [0.5, 0.25, 0.25])
        attempt("index out of range", tiny, g2, [0.5, 0.5], index=2)

        def tied():
            from hcomm.models import build_model

            return build_model(dataclasses.replace(config("tiny"), tie_embeddings=True), vocab_size=VOCAB, seed=SEED)

        attempt("tied embeddings", tied, g2, [0.5, 0.5])
    if ctx.in_group(3):
        g3 = ctx.groups[3][0]
        attempt("more ranks than kv heads", functools.partial(build, "gqa2"), g3, [0.5, 0.25, 0.25])
    return out
