"""Training text: where it comes from and how it becomes token ids.

A corpus is an ordered list of documents capped at ``max_bytes`` of UTF-8,
read from one of:

* nothing given: the Python standard library's own ``.py`` files, so a run
  needs no download;
* a text file, or a folder of text files (read recursively, sorted);
* a Hugging Face ``datasets`` folder written by ``save_to_disk``.

Two tokenizers: ``bytes`` (UTF-8 bytes, vocab 256) and ``bpe`` (byte-level
BPE trained here on the corpus with the ``tokenizers`` library).
"""
from __future__ import annotations

import os
import sys
import sysconfig
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, List, Optional, Tuple

import torch

TEXT_SUFFIXES = (".txt", ".md", ".py", ".rst", ".json", ".jsonl", ".csv")
# Tests, IDE and demo code repeat themselves a lot; site-packages varies per host.
_STDLIB_SKIPPED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idlelib",
                        "turtledemo", "__pycache__"}
_DATASETS_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
_MIB = float(1 << 20)


@dataclass
class Corpus:
    """Documents to read, plus the files whose sizes and mtimes identify them."""

    files: List[str]
    describe: Callable[[int], str]  # bytes read -> human description
    documents: Callable[[], Iterator[str]]


def default_corpus_files(max_bytes: int) -> List[str]:
    """The stdlib ``.py`` files, sorted by relative path, up to ``max_bytes`` in total.

    The last file is the one that reaches ``max_bytes``; reading truncates it.
    """
    root = sysconfig.get_paths()["stdlib"]
    found: List[Tuple[str, str]] = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if d not in _STDLIB_SKIPPED_DIRS]
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                found.append((os.path.relpath(path, root).replace(os.sep, "/"), path))
    chosen, total = [], 0
    for _, path in sorted(found):
        if total >= max_bytes:
            break
        chosen.append(path)
        total += os.path.getsize(path)
    return chosen


def open_corpus(data: Optional[str], max_bytes: int) -> Corpus:
    """The corpus named by ``--data`` (None: the stdlib); errors name the path."""
    if data is None:
        files = default_corpus_files(max_bytes)
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        return Corpus(files, lambda n: f"Python {version} stdlib, {len(files)} files, {n / _MIB:.1f} MiB",
                      lambda: _read_files(files))
    path = os.path.abspath(os.path.expanduser(data))
    if not os.path.exists(path):
        raise ValueError(f"--data {data!r}: no such file or folder ({path})")
    if os.path.isfile(path):
        return Corpus([path], lambda n: f"{path}, {n / _MIB:.1f} MiB", lambda: _read_files([path]))
    if any(os.path.exists(os.path.join(path, m)) for m in _DATASETS_MARKERS):
        return _datasets_corpus(path)
    files = sorted(os.path.join(folder, name) for folder, _, names in os.walk(path)
                   for name in names if name.endswith(TEXT_SUFFIXES))
    if not files:
        raise ValueError(f"--data {path}: folder holds no text files ({', '.join(TEXT_SUFFIXES)})")
    return Corpus(files, lambda n: f"{path}, {len(files)} files, {n / _MIB:.1f} MiB",
                  lambda: _read_files(files))


def capped(documents: Iterable[str], max_bytes: int) -> Iterator[str]:
    """The non-empty documents, each ending in a newline, cut off after ``max_bytes`` UTF-8 bytes."""
    left = max_bytes
    for text in documents:
        if left <= 0:
            return
        if not text:
            continue
        if not text.endswith("\n"):
            text += "\n"
        raw = text.encode("utf-8")
        if len(raw) > left:
            # Cutting bytes may split a character; drop its partial tail.
            text = raw[:left].decode("utf-8", errors="ignore")
        left -= len(raw)
        yield text


def _read_files(files: List[str]) -> Iterator[str]:
    for path in files:
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as exc:
            raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
        yield raw.decode("utf-8", errors="replace")


def _datasets_corpus(path: str) -> Corpus:
    import datasets  # optional dependency, only for this kind of source

    try:
        loaded = datasets.load_from_disk(path)
    except Exception as exc:  # the library raises many kinds for a broken folder
        raise ValueError(f"--data {path}: cannot load as a datasets folder: {exc}") from None
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded:
            raise ValueError(f"--data {path}: DatasetDict has no 'train' split (splits: {sorted(loaded)})")
        loaded = loaded["train"]
    column = _text_column(path, loaded.features)
    files = sorted(os.path.join(folder, name) for folder, _, names in os.walk(path) for name in names)
    return Corpus(files,
                  lambda n: f"{path} (datasets, column {column!r}, {len(loaded)} rows), {n / _MIB:.1f} MiB",
                  lambda: (text or "" for rows in loaded.select_columns([column]).iter(batch_size=1024)
                           for text in rows[column]))


def _text_column(path: str, features) -> str:
    strings = [name for name, kind in features.items()
               if getattr(kind, "dtype", None) in ("string", "large_string")]
    if "text" in strings:
        return "text"
    if len(strings) == 1:
        return strings[0]
    raise ValueError(f"--data {path}: no 'text' column and not exactly one string column "
                     f"(columns: {dict((name, str(kind)) for name, kind in features.items())})")


# --- tokenizers ---------------------------------------------------------------

class ByteTokenizer:
    """UTF-8 bytes as token ids: vocab 256, nothing to train."""

    kind = "bytes"
    vocab_size = 256

    def encode(self, text: str) -> List[int]:
        return list(text.encode("utf-8"))

    def encode_all(self, texts: List[str]) -> torch.Tensor:
        raw = bytearray("".join(texts).encode("utf-8"))
        return torch.frombuffer(raw, dtype=torch.uint8).to(torch.int32) if raw else torch.zeros(0, dtype=torch.int32)

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


class BpeTokenizer:
    """Byte-level BPE (GPT-2 style): any text encodes, no unknown tokens."""

    kind = "bpe"
    _ENCODE_CHUNK = 64  # documents per encode_batch call: bounds the per-token objects alive

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size()

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> "BpeTokenizer":
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tokenizer.train_from_iterator(texts, trainer)
        return cls(tokenizer)

    def encode(self, text: str) -> List[int]:
        return self._tokenizer.encode(text).ids

    def encode_all(self, texts: List[str]) -> torch.Tensor:
        parts = [torch.zeros(0, dtype=torch.int32)]
        for first in range(0, len(texts), self._ENCODE_CHUNK):
            batch = self._tokenizer.encode_batch(texts[first:first + self._ENCODE_CHUNK])
            parts.extend(torch.tensor(e.ids, dtype=torch.int32) for e in batch)
        return torch.cat(parts)

    def decode(self, ids: Iterable[int]) -> str:
        return self._tokenizer.decode([int(i) for i in ids])

    def save(self, path: str) -> None:
        self._tokenizer.save(path)

    @classmethod
    def load(cls, path: str) -> "BpeTokenizer":
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(path))
