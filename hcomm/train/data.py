"""Token stream and the global sample order every parallel plan trains on.

:func:`load_tokens` turns a corpus (see :mod:`hcomm.train.corpus`) into one
int32 token tensor, caching the trained tokenizer and the tokens in
``HCOMM_DATA_CACHE``.  :class:`GlobalBatches` fixes which samples make up
global batch ``step``, independently of how many ranks share it; a rank
takes its rows with :meth:`GlobalBatches.rows` at the offset that
:func:`split_counts` and :func:`offsets` give it.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Dict, List, Optional, Sequence, Union

import torch

from hcomm.settings import declare
from hcomm.train.corpus import BpeTokenizer, ByteTokenizer, capped, open_corpus

HCOMM_DATA_CACHE = declare(
    "HCOMM_DATA_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "hcomm", "data"),
    "folder of trained BPE tokenizers and encoded token arrays, one subfolder per corpus + tokenizer")

TOKENIZERS = ("bytes", "bpe")
_CACHE_FORMAT = 1  # bump when the cached files change meaning
Tokenizer = Union[ByteTokenizer, BpeTokenizer]


@dataclass
class TokenData:
    """A tokenized corpus.

    ``tokens`` is int32 (half the memory of int64; every vocab fits), 1-D;
    :class:`GlobalBatches` hands out int64 rows.
    """

    tokens: torch.Tensor
    vocab_size: int
    source: str
    tokenizer: str
    codec: Tokenizer = field(repr=False)

    def decode(self, ids) -> str:
        return self.codec.decode(ids)


def load_tokens(data: Optional[str] = None, tokenizer: str = "bpe", vocab_size: int = 1024,
                max_bytes: int = 8 << 20) -> TokenData:
    """Tokenize the corpus ``data`` (None: the stdlib), from the cache when possible.

    Every rank may call this at once: the result is deterministic and cache
    files are written atomically, so racing writers agree.
    """
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"tokenizer must be one of {TOKENIZERS}, got {tokenizer!r}")
    if tokenizer == "bytes":
        vocab_size = ByteTokenizer.vocab_size
    elif vocab_size < 256:
        raise ValueError(f"vocab_size must be >= 256 for the byte-level bpe tokenizer, got {vocab_size}")
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
    corpus = open_corpus(data, max_bytes)
    folder = os.path.join(HCOMM_DATA_CACHE.get(), _cache_key(tokenizer, vocab_size, corpus.files, max_bytes))
    meta_path = os.path.join(folder, "meta.json")
    if not os.path.exists(meta_path):  # meta.json is written last: its presence means complete
        _build_cache(folder, corpus, tokenizer, vocab_size, max_bytes)
    with open(meta_path) as f:
        meta = json.load(f)
    codec = (BpeTokenizer.load(os.path.join(folder, "tokenizer.json")) if tokenizer == "bpe"
             else ByteTokenizer())
    tokens = torch.load(os.path.join(folder, "tokens.pt"), weights_only=True)
    return TokenData(tokens, codec.vocab_size, meta["source"], tokenizer, codec)


def _cache_key(tokenizer: str, vocab_size: int, files: List[str], max_bytes: int) -> str:
    stats = []
    for path in sorted(files):
        st = os.stat(path)
        stats.append([path, st.st_size, st.st_mtime_ns])
    identity = json.dumps([_CACHE_FORMAT, tokenizer, vocab_size, max_bytes, stats])
    return hashlib.sha1(identity.encode("utf-8")).hexdigest()


def _build_cache(folder: str, corpus, tokenizer: str, vocab_size: int, max_bytes: int) -> None:
    texts = list(capped(corpus.documents(), max_bytes))
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    if n_bytes == 0:
        raise ValueError(f"corpus {corpus.describe(0)} holds no text")
    codec = BpeTokenizer.train(texts, vocab_size) if tokenizer == "bpe" else ByteTokenizer()
    os.makedirs(folder, exist_ok=True)
    if tokenizer == "bpe":
        _write_atomically(os.path.join(folder, "tokenizer.json"), codec.save)
    tokens = codec.encode_all(texts)
    _write_atomically(os.path.join(folder, "tokens.pt"), lambda p: torch.save(tokens, p))
    meta = {"source": corpus.describe(n_bytes), "tokenizer": tokenizer, "vocab_size": codec.vocab_size,
            "tokens": len(tokens), "bytes": n_bytes}
    _write_atomically(os.path.join(folder, "meta.json"), lambda p: _write_json(p, meta))


def _write_json(path: str, value) -> None:
    with open(path, "w") as f:
        json.dump(value, f, indent=1)


def _write_atomically(path: str, write) -> None:
    """``write(tmp)`` then rename onto ``path``: readers see all of it or none."""
    directory, name = os.path.split(path)
    # torch.save names its archive after the file name up to the first dot: keep `name` first.
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=name + ".", suffix=".tmp")
    os.close(fd)
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a shared cache from other users
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class GlobalBatches:
    """The training sample order: global batch ``step`` is a fixed set of windows.

    Window ``k`` is ``tokens[k*seq_len : k*seq_len + seq_len + 1]`` (inputs and
    targets shifted by one, sharing the boundary token with window ``k+1``).
    Sample ``i`` of step ``step`` is global sample ``g = step*global_batch + i``;
    epoch ``g // len(self)`` visits all windows in a permutation seeded with
    ``seed + epoch``.  So a row depends on (tokens, seq_len, seed,
    global_batch, step, i) only, never on the ranks or the parallel plan.
    """

    def __init__(self, tokens: torch.Tensor, seq_len: int, global_batch: int, seed: int = 0) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        if global_batch < 1:
            raise ValueError(f"global_batch must be >= 1, got {global_batch}")
        n_windows = (len(tokens) - 1) // seq_len
        if n_windows < 1:
            raise ValueError(f"corpus of {len(tokens)} tokens is too small for one window of "
                             f"seq_len + 1 = {seq_len + 1} tokens")
        self.tokens = tokens
        self.seq_len = seq_len
        self.global_batch = global_batch
        self.seed = seed
        self._n_windows = n_windows
        self._permutations: Dict[int, torch.Tensor] = {}
        self._span = torch.arange(seq_len + 1)

    def __len__(self) -> int:
        """Number of windows, i.e. samples per epoch."""
        return self._n_windows

    def global_batch_rows(self, step: int) -> torch.Tensor:
        return self.rows(step, 0, self.global_batch)

    def rows(self, step: int, start: int, count: int) -> torch.Tensor:
        """Rows ``start:start+count`` of global batch ``step``: int64 ``[count, seq_len + 1]``."""
        if step < 0 or start < 0 or count < 0 or start + count > self.global_batch:
            raise ValueError(f"rows(step={step}, start={start}, count={count}) is outside a "
                             f"global batch of {self.global_batch}")
        sample = step * self.global_batch + torch.arange(start, start + count)
        epoch, position = sample // self._n_windows, sample % self._n_windows
        windows = torch.empty_like(sample)
        for e in epoch.unique().tolist():
            here = epoch == e
            windows[here] = self._permutation(e)[position[here]]
        return self.tokens[windows[:, None] * self.seq_len + self._span].long()

    def _permutation(self, epoch: int) -> torch.Tensor:
        if epoch not in self._permutations:
            # A batch spans at most a few epochs; keeping two covers the boundary.
            while len(self._permutations) >= 2:
                self._permutations.pop(min(self._permutations))
            generator = torch.Generator().manual_seed(self.seed + epoch)
            self._permutations[epoch] = torch.randperm(self._n_windows, generator=generator)
        return self._permutations[epoch]


def split_counts(global_batch: int, shares: Sequence[float]) -> List[int]:
    """Per-rank sample counts proportional to ``shares`` that sum to ``global_batch``.

    Largest-remainder rounding in exact arithmetic, ties to the lower rank;
    a zero share gets 0, and every count is within 1 of its ideal.
    """
    if global_batch < 0:
        raise ValueError(f"global_batch must be >= 0, got {global_batch}")
    if any(not math.isfinite(s) or s < 0 for s in shares):
        raise ValueError(f"shares must be finite and >= 0, got {list(shares)}")
    total = sum(Fraction(s) for s in shares)
    if total == 0:
        raise ValueError(f"shares must not all be zero, got {list(shares)}")
    ideal = [Fraction(s) * global_batch / total for s in shares]
    counts = [math.floor(x) for x in ideal]
    left = global_batch - sum(counts)
    # Remainders sum to `left` and each is < 1, so only positive shares are picked.
    by_remainder = sorted(range(len(shares)), key=lambda r: (-(ideal[r] - counts[r]), r))
    for rank in by_remainder[:left]:
        counts[rank] += 1
    return counts


def offsets(counts: Sequence[int]) -> List[int]:
    """Exclusive prefix sums: where each rank's rows start in the global batch."""
    out, at = [], 0
    for c in counts:
        out.append(at)
        at += c
    return out
