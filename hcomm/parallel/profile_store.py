"""Getting every rank's model profile: exchange, cache, file override.

``HCOMM_MODEL_PROFILE`` chooses where this rank's profile comes from:

* ``auto`` (default): the cache if it holds one, else measure and save;
* ``force``: always measure (and refresh the cache);
* a path to a YAML or JSON file of per-rank profiles, which overrides
  measuring altogether -- for planning a cluster you do not have, or for
  pinning a plan's inputs.  The file holds a list of profiles (or a mapping
  with a ``profiles:`` list) in the shape of ``DeviceProfile.to_dict()``;
  the memory budget fields may be left out and are then read on this rank.

Cached profiles are JSON files in ``<HCOMM_PROFILE_CACHE>/models/``, one per
(model, device, cluster, micro-batch, sequence length).  Each rank resolves
its own profile alone (no collective), then :func:`gather_profiles` shares
them through the rendezvous store so every rank plans from the same table.
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import tempfile
import time
from typing import List, Optional

import torch
import yaml
from torch import nn

from hcomm.errors import HCommError
from hcomm.parallel.devices import HCOMM_EMU_DEVICE, local_device_name
from hcomm.parallel.profile import DeviceProfile, measure, memory_budget
from hcomm.profiling import HCOMM_PROFILE_CACHE
from hcomm.settings import declare

HCOMM_MODEL_PROFILE = declare(
    "HCOMM_MODEL_PROFILE", "auto",
    "model profile per rank: auto (cache, else measure and save), force (always measure), "
    "or the path of a YAML/JSON file of per-rank profiles that overrides measuring")
# Also declared by hcomm.emulate.rankwrap, which sets it; read here for the cache key.
HCOMM_EMU_SPEED = declare("HCOMM_EMU_SPEED", 1.0, "relative compute speed of this rank, 0 < s <= 1 (set by hcomm emulate run)")

KEY_PREFIX = "hcomm/model-profile"


def gather_profiles(local: DeviceProfile, store, rank: int, world_size: int, timeout_s: float = 60.0,
                    key_prefix: str = KEY_PREFIX) -> List[DeviceProfile]:
    """Every rank's profile, in rank order, through a torch.distributed Store.

    Use a fresh `key_prefix` to gather again on the same store (keys are
    never deleted, so a second gather under the same prefix would read the
    first one's profiles).
    """
    keys = [f"{key_prefix}/{r}" for r in range(world_size)]
    store.set(keys[rank], json.dumps(local.to_dict()))
    try:
        store.wait(keys, datetime.timedelta(seconds=timeout_s))
    except RuntimeError as exc:  # DistStoreError on timeout
        missing = [r for r, key in enumerate(keys) if not store.check([key])]
        raise HCommError(f"model profiles: rank(s) {missing} of {world_size} did not report "
                         f"within {timeout_s:g} s (key prefix {key_prefix!r})") from exc
    return [local if r == rank else DeviceProfile.from_dict(json.loads(store.get(key)))
            for r, key in enumerate(keys)]


def model_signature(config_dict: dict, vocab_size: int) -> str:
    """Short stable id of a model's shape: equal configs give equal cache keys."""
    text = json.dumps({"config": config_dict, "vocab_size": vocab_size}, sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def cache_key(model_signature: str, device: str, cluster_signature: str, micro_batch: int, seq_len: int) -> str:
    """File-name-safe key.  The torch version and thread count go into the
    digest too: both change kernel speed, so a profile from another build or
    thread setting must not be reused."""
    salt = f"{cluster_signature}|torch {torch.__version__}|threads {torch.get_num_threads()}"
    digest = hashlib.sha1(salt.encode()).hexdigest()[:10]
    safe_device = "".join(c if c.isalnum() or c in "._-" else "_" for c in device)
    return f"{safe_device}-{model_signature}-mb{micro_batch}-seq{seq_len}-{digest}"


def _cache_path(key: str) -> str:
    return os.path.join(HCOMM_PROFILE_CACHE.get(), "models", f"{key}.json")


def load_cached(key: str) -> Optional[DeviceProfile]:
    """The cached profile under `key`, or None; an unreadable file is a miss."""
    try:
        with open(_cache_path(key)) as f:
            return dataclasses.replace(DeviceProfile.from_dict(json.load(f)), source="cache")
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_cached(key: str, profile: DeviceProfile) -> bool:
    """Write atomically (temp file + rename: ranks sharing a key never read
    half a file); False when the cache folder is not writable, which must not
    fail the job."""
    path = _cache_path(key)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(path), suffix=".tmp", delete=False) as f:
            json.dump(profile.to_dict(), f, indent=1)
        os.replace(f.name, path)
        return True
    except OSError:
        return False


def load_profile_file(path: str, rank: int, baseline_bytes: Optional[int] = None,
                      compute_dtype: str = "fp32") -> DeviceProfile:
    """Rank `rank`'s profile from a YAML or JSON file (see the module doc), the one measured in
    ``compute_dtype`` (an entry without the field is fp32)."""
    if not os.path.isfile(path):
        raise ValueError(f"HCOMM_MODEL_PROFILE={path!r}: expected auto, force or an existing profile file")
    with open(path) as f:
        # json for .json: PyYAML (YAML 1.1) would read json.dump's "1e-05" as a string.
        data = json.load(f) if path.endswith(".json") else yaml.safe_load(f)
    entries = data.get("profiles") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a list of profiles (or a mapping with a 'profiles' list)")
    mine = [e for e in entries if isinstance(e, dict) and e.get("rank") == rank
            and e.get("compute_dtype", "fp32") == compute_dtype]
    if not mine:
        ranks = sorted(e.get("rank") for e in entries if isinstance(e, dict)
                       and e.get("compute_dtype", "fp32") == compute_dtype)
        raise ValueError(f"{path}: no profile for rank {rank} in {compute_dtype} (ranks present in "
                         f"{compute_dtype}: {ranks})")
    budget, baseline, budget_source = memory_budget(baseline_bytes)
    defaults = {"memory_budget_bytes": budget, "baseline_bytes": baseline, "budget_source": budget_source,
                "seconds_spent": 0.0}
    try:
        return DeviceProfile.from_dict({**defaults, **mine[0], "source": "file"})
    except KeyError as exc:
        raise ValueError(f"{path}: the profile of rank {rank} lacks field {exc}") from None


def device_identity(model: nn.Module) -> str:
    """What a profile's speed depends on besides the model: the device kind,
    its emulated speed (two 910B ranks at speeds 0.75 and 1.0 must not share
    a profile) and the compute dtype."""
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    speed = f"@{HCOMM_EMU_SPEED.get():g}" if HCOMM_EMU_DEVICE.get() else ""
    return f"{local_device_name()}{speed}-{dtype}"


def resolve_profile(model: nn.Module, *, model_signature: str, cluster_signature: str, micro_batch: int,
                    seq_len: int, vocab_size: int, rank: int, budget_s: float = 10.0,
                    baseline_bytes: Optional[int] = None, compute_dtype: str = "fp32") -> DeviceProfile:
    """This rank's profile by the ``HCOMM_MODEL_PROFILE`` policy (module doc).

    The memory budget is always this run's (a cached profile brings only
    times and sizes); `baseline_bytes` is the RSS recorded at start.
    """
    start = time.perf_counter()
    mode = HCOMM_MODEL_PROFILE.get()
    n_pieces = len(model.layer_modules())
    if mode not in ("auto", "force"):
        profile = load_profile_file(mode, rank, baseline_bytes, compute_dtype)
        if len(profile.layers) != n_pieces:
            raise ValueError(f"{mode}: rank {rank}'s profile has {len(profile.layers)} pieces, "
                             f"the model has {n_pieces}")
        return profile
    identity = device_identity(model) + ("" if compute_dtype == "fp32" else f"-autocast-{compute_dtype}")
    key = cache_key(model_signature, identity, cluster_signature, micro_batch, seq_len)
    cached = load_cached(key) if mode == "auto" else None
    if cached is not None and len(cached.layers) == n_pieces:
        budget, baseline, budget_source = memory_budget(baseline_bytes)
        return dataclasses.replace(cached, rank=rank, memory_budget_bytes=budget, baseline_bytes=baseline,
                                   budget_source=budget_source, seconds_spent=time.perf_counter() - start)
    profile = measure(model, micro_batch=micro_batch, seq_len=seq_len, vocab_size=vocab_size, rank=rank,
                      budget_s=budget_s, baseline_bytes=baseline_bytes, compute_dtype=compute_dtype)
    save_cached(key, profile)
    return profile
