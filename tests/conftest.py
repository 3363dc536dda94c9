"""Suite-wide configuration: markers (declared in pyproject.toml), device skips, hypothesis profile.

Tiers: tests/core (thread ranks, in-process), tests/torch (worker processes
over FileStore, torchrun), tests/emulate (root + namespaces), GPU tests
skipped by device count.
"""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

try:
    from hypothesis import settings

    # Bounded and deadline-free: the box is shared and 2-core, timings are noise.
    settings.register_profile("hcomm", max_examples=25, deadline=None, derandomize=True)
    settings.load_profile(os.environ.get("HCOMM_HYPOTHESIS_PROFILE", "hcomm"))
except ImportError:  # hypothesis is an optional test extra
    pass


def cuda_device_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def requires_gpus(n: int = 1):
    """Decorator: skip unless at least `n` CUDA devices are visible (and mark the test `gpu`)."""

    def wrap(fn):
        fn = pytest.mark.gpu(fn)
        return pytest.mark.skipif(cuda_device_count() < n, reason=f"needs {n} CUDA device(s)")(fn)

    return wrap


def pytest_collection_modifyitems(config, items):
    # Tests marked `gpu` without requires_gpus still skip cleanly on CPU-only machines.
    if cuda_device_count() > 0:
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def shared_data_cache(tmp_path_factory):
    """One tokenised-corpus cache for the whole run (``HCOMM_DATA_CACHE``, inherited by every ``hcomm
    train`` the tests start): entries are keyed by the corpus files, tokenizer, vocabulary and byte cap and
    written atomically, so tests share them safely; each launch re-trained the tokenizer on rank 0 before."""
    os.environ["HCOMM_DATA_CACHE"] = str(tmp_path_factory.mktemp("data-cache"))
    yield os.environ["HCOMM_DATA_CACHE"]
