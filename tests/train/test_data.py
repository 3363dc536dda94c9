"""hcomm.train.data / corpus: corpus sources, tokenizers + cache, the global sample order, batch splits."""
import os
import sysconfig

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from hcomm.train import corpus as corpus_module
from hcomm.train.corpus import ByteTokenizer, default_corpus_files
from hcomm.train.data import GlobalBatches, load_tokens, offsets, split_counts

SAMPLE_TEXT = "def add(a, b):\n    return a + b  # ünïcode ✓\n"


@pytest.fixture(autouse=True)
def data_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("HCOMM_DATA_CACHE", str(cache))
    return cache


@pytest.fixture
def small_corpus(tmp_path):
    """A few KB of varied text in a folder, plus a file the folder reader must skip."""
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    words = ["alpha", "beta", "gamma", "delta", "return", "lambda", "import", "class"]
    for n in range(4):
        lines = [f"{words[(n + i) % 8]} {words[(3 * i) % 8]} = {i * n}\n" for i in range(60)]
        (folder / ("sub" if n % 2 else "") / f"doc{n}.txt").write_text("".join(lines))
    (folder / "ignored.bin").write_bytes(b"\x00\x01")
    return folder


def corpus_text(data) -> str:
    return data.decode(data.tokens)


def arange_batches(n_tokens=101, seq_len=4, global_batch=8, seed=0):
    return GlobalBatches(torch.arange(n_tokens, dtype=torch.int32), seq_len, global_batch, seed)


# --- GlobalBatches ---------------------------------------------------------------

def test_rows_are_deterministic_and_int64():
    a, b = arange_batches(seed=3), arange_batches(seed=3)
    for step in range(5):
        assert torch.equal(a.global_batch_rows(step), b.global_batch_rows(step))
    rows = a.global_batch_rows(0)
    assert rows.dtype == torch.int64 and rows.shape == (8, 5)
    assert not torch.equal(rows, arange_batches(seed=4).global_batch_rows(0))


def test_windows_are_contiguous_slices_sharing_a_boundary_token():
    batches = arange_batches(n_tokens=101, seq_len=4)
    assert len(batches) == 25  # (101 - 1) // 4
    starts = set()
    for row in batches.global_batch_rows(1):
        start = int(row[0])
        assert start % 4 == 0 and start + 4 < 101
        assert torch.equal(row, torch.arange(start, start + 5))  # inputs row[:-1], targets row[1:]
        starts.add(start)
    assert len(starts) == 8  # no window twice within an epoch


@pytest.mark.parametrize("start,count", [(0, 8), (0, 0), (3, 0), (8, 0), (2, 3), (7, 1), (0, 5)])
def test_rows_equal_slices_of_the_global_batch(start, count):
    batches = arange_batches(seed=11)
    for step in (0, 2, 7):  # step 7 crosses an epoch boundary (25 windows, 8 per step)
        rows = batches.rows(step, start, count)
        assert rows.shape == (count, 5)
        assert torch.equal(rows, batches.global_batch_rows(step)[start:start + count])


@given(cuts=st.lists(st.integers(0, 8), max_size=6), step=st.integers(0, 40))
def test_any_split_into_ranks_concatenates_to_the_global_batch(cuts, step):
    bounds = [0] + sorted(cuts) + [8]
    counts = [hi - lo for lo, hi in zip(bounds, bounds[1:])]
    batches = arange_batches(seed=5)
    parts = [batches.rows(step, at, n) for at, n in zip(offsets(counts), counts)]
    assert torch.equal(torch.cat(parts), batches.global_batch_rows(step))


@pytest.mark.parametrize("counts", [[4, 3, 1], [8], [2, 2, 2, 2], [0, 5, 3]])
def test_listed_splits_concatenate_to_the_global_batch(counts):
    batches = arange_batches(seed=1)
    parts = [batches.rows(4, at, n) for at, n in zip(offsets(counts), counts)]
    assert torch.equal(torch.cat(parts), batches.global_batch_rows(4))


def test_epochs_wrap_with_a_fresh_permutation():
    batches = GlobalBatches(torch.arange(33), seq_len=4, global_batch=4, seed=2)  # 8 windows: 2 steps/epoch
    epochs = [torch.cat([batches.global_batch_rows(s)[:, 0] for s in (2 * e, 2 * e + 1)]) for e in range(3)]
    for order in epochs:
        assert sorted(order.tolist()) == list(range(0, 32, 4))  # every window once per epoch
    assert not (torch.equal(epochs[0], epochs[1]) and torch.equal(epochs[1], epochs[2]))


def test_global_batch_larger_than_an_epoch():
    batches = GlobalBatches(torch.arange(9), seq_len=4, global_batch=7, seed=0)  # 2 windows
    rows = batches.global_batch_rows(3)
    assert torch.equal(rows[2:5], batches.rows(3, 2, 3))
    assert set(rows[:, 0].tolist()) == {0, 4}


@pytest.mark.parametrize("kwargs,words", [
    (dict(seq_len=0), ["seq_len"]),
    (dict(global_batch=0), ["global_batch"]),
    (dict(n_tokens=4, seq_len=4), ["4 tokens", "5"]),
    (dict(n_tokens=0), ["0 tokens"]),
])
def test_batch_errors_name_the_field(kwargs, words):
    with pytest.raises(ValueError) as info:
        arange_batches(**kwargs)
    for word in words:
        assert word in str(info.value)


def test_smallest_corpus_is_one_window():
    assert len(arange_batches(n_tokens=5, seq_len=4)) == 1


def test_rows_outside_the_batch_are_refused():
    with pytest.raises(ValueError, match="global batch of 8"):
        arange_batches().rows(0, 6, 3)


# --- split_counts ----------------------------------------------------------------

@pytest.mark.parametrize("global_batch,shares,expected", [
    (10, [0.5, 0.3, 0.2], [5, 3, 2]),
    (7, [0.5, 0.3, 0.2], [4, 2, 1]),
    (7, [0.5, 0.0, 0.3, 0.2], [4, 0, 2, 1]),
    (3, [1, 1], [2, 1]),  # tie goes to the lower rank
    (0, [1, 2], [0, 0]),
    (5, [0, 3], [0, 5]),
])
def test_split_counts_examples(global_batch, shares, expected):
    assert split_counts(global_batch, shares) == expected


def test_offsets_are_exclusive_prefix_sums():
    assert offsets([4, 3, 1]) == [0, 4, 7]
    assert offsets([0, 5, 3]) == [0, 0, 5]
    assert offsets([]) == []


@given(global_batch=st.integers(0, 500),
       shares=st.lists(st.one_of(st.just(0.0), st.floats(0.001, 100.0)), min_size=1, max_size=8)
       .filter(lambda s: sum(s) > 0))
def test_split_counts_property(global_batch, shares):
    counts = split_counts(global_batch, shares)
    assert sum(counts) == global_batch
    for count, share in zip(counts, shares):
        assert abs(count - global_batch * share / sum(shares)) < 1 + 1e-9
        if share == 0:
            assert count == 0


@pytest.mark.parametrize("shares,word", [([0.5, -0.1], "-0.1"), ([0, 0.0], "all be zero"),
                                         ([1.0, float("nan")], "nan")])
def test_split_counts_errors_name_the_shares(shares, word):
    with pytest.raises(ValueError, match="shares") as info:
        split_counts(8, shares)
    assert word in str(info.value)


# --- tokenizers and load_tokens ---------------------------------------------------

def test_bytes_tokenizer_round_trip():
    codec = ByteTokenizer()
    ids = codec.encode(SAMPLE_TEXT)
    assert max(ids) < 256 and len(ids) == len(SAMPLE_TEXT.encode("utf-8"))
    assert codec.decode(ids) == SAMPLE_TEXT
    assert codec.encode_all([SAMPLE_TEXT, "x"]).tolist() == ids + [ord("x")]


def test_load_tokens_bytes_from_a_file(tmp_path):
    path = tmp_path / "one.txt"
    path.write_text(SAMPLE_TEXT)
    data = load_tokens(str(path), tokenizer="bytes")
    assert data.tokenizer == "bytes" and data.vocab_size == 256 and data.tokens.dtype == torch.int32
    assert corpus_text(data) == SAMPLE_TEXT
    assert str(path) in data.source


def test_max_bytes_caps_the_corpus(small_corpus):
    data = load_tokens(str(small_corpus), tokenizer="bytes", max_bytes=1000)
    assert len(data.tokens) == 1000
    assert "4 files" in data.source


def test_bpe_trains_the_requested_vocab_and_hits_the_cache(small_corpus, monkeypatch):
    data = load_tokens(str(small_corpus), tokenizer="bpe", vocab_size=300)
    assert data.vocab_size == 300 and int(data.tokens.max()) < 300
    assert len(data.tokens) < sum(f.stat().st_size for f in small_corpus.rglob("*.txt"))  # it compresses
    assert corpus_text(data).startswith((small_corpus / "doc0.txt").read_text())  # sorted: doc0.txt first

    def no_training(*args, **kwargs):
        raise AssertionError("retrained despite a cache hit")

    monkeypatch.setattr(corpus_module.BpeTokenizer, "train", classmethod(no_training))
    again = load_tokens(str(small_corpus), tokenizer="bpe", vocab_size=300)
    assert torch.equal(again.tokens, data.tokens) and again.source == data.source
    assert corpus_text(again) == corpus_text(data)
    with pytest.raises(AssertionError, match="retrained"):  # another vocab is another cache entry
        load_tokens(str(small_corpus), tokenizer="bpe", vocab_size=280)


def test_bpe_round_trips_unseen_text(small_corpus):
    data = load_tokens(str(small_corpus), tokenizer="bpe", vocab_size=280)
    assert data.codec.decode(data.codec.encode(SAMPLE_TEXT)) == SAMPLE_TEXT


def test_changed_file_invalidates_the_cache(tmp_path):
    path = tmp_path / "one.txt"
    path.write_text("first version\n")
    assert corpus_text(load_tokens(str(path), tokenizer="bytes")) == "first version\n"
    path.write_text("second, longer version\n")
    assert corpus_text(load_tokens(str(path), tokenizer="bytes")) == "second, longer version\n"


def test_default_corpus_is_the_stdlib_and_deterministic():
    files = default_corpus_files(256 << 10)
    assert files and files == default_corpus_files(256 << 10)
    stdlib = sysconfig.get_paths()["stdlib"]
    relative = [os.path.relpath(f, stdlib) for f in files]
    assert relative == sorted(relative, key=lambda r: r.replace(os.sep, "/"))
    for r in relative:
        parts = r.split(os.sep)
        assert r.endswith(".py") and not {"site-packages", "test", "tests", "idlelib"} & set(parts)
    assert sum(os.path.getsize(f) for f in files[:-1]) < 256 << 10 <= sum(os.path.getsize(f) for f in files)
    data = load_tokens(None, tokenizer="bytes", max_bytes=64 << 10)
    assert len(data.tokens) == 64 << 10 and data.source.startswith("Python ") and "stdlib" in data.source


def test_datasets_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "ds"
    datasets.Dataset.from_dict({"id": [1, 2], "text": ["first row", "second row"]}).save_to_disk(str(folder))
    data = load_tokens(str(folder), tokenizer="bytes")
    assert corpus_text(data) == "first row\nsecond row\n"
    assert "2 rows" in data.source

    only_string = tmp_path / "dict"
    split = datasets.Dataset.from_dict({"body": ["train text"], "n": [1]})
    datasets.DatasetDict({"train": split, "test": split}).save_to_disk(str(only_string))
    assert corpus_text(load_tokens(str(only_string), tokenizer="bytes")) == "train text\n"


def test_datasets_folder_without_a_text_column(tmp_path):
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "numbers"
    datasets.Dataset.from_dict({"n": [1, 2], "m": [3, 4]}).save_to_disk(str(folder))
    with pytest.raises(ValueError) as info:
        load_tokens(str(folder), tokenizer="bytes")
    assert str(folder) in str(info.value) and "'n'" in str(info.value) and "'m'" in str(info.value)


def test_source_errors_name_the_path(tmp_path):
    missing = tmp_path / "nowhere.txt"
    with pytest.raises(ValueError, match="nowhere.txt"):
        load_tokens(str(missing), tokenizer="bytes")
    empty = tmp_path / "empty_folder"
    empty.mkdir()
    (empty / "data.bin").write_bytes(b"\x00")
    with pytest.raises(ValueError, match="empty_folder.*no text files"):
        load_tokens(str(empty), tokenizer="bytes")
    blank = tmp_path / "blank.txt"
    blank.write_text("")
    with pytest.raises(ValueError, match="blank.txt.*no text"):
        load_tokens(str(blank), tokenizer="bytes")


@pytest.mark.parametrize("kwargs,word", [(dict(tokenizer="words"), "tokenizer"),
                                         (dict(vocab_size=100), "vocab_size"),
                                         (dict(max_bytes=0), "max_bytes")])
def test_argument_errors_name_the_field(kwargs, word):
    with pytest.raises(ValueError, match=word):
        load_tokens(**kwargs)
