"""Committing a checkpoint directory atomically: marker last, then a rename into place.

The ranks write into a fresh sibling ``.<name>.tmp-<id>``; once every rank's
data is on disk, rank 0 writes the commit marker (the manifest: shapes,
dtypes, world size, every file's size) with fsync, moves an older checkpoint
aside, renames the new one into place and deletes the old one (putting it
back if the rename fails).  A directory without the marker is never loaded.
"""
from __future__ import annotations

import json
import os
import shutil
import uuid

MARKER = "hcomm_checkpoint.json"  # the commit marker; its presence means "complete"


def sibling(path: str, kind: str) -> str:
    parent, base = os.path.split(path)
    return os.path.join(parent, f".{base}.{kind}-{uuid.uuid4().hex[:12]}")


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass  # not every file system syncs directories; the renames are still atomic


def check_replaceable(path: str) -> None:
    """`path` may be replaced only if it is absent, an empty directory or a checkpoint (ours or DCP's)."""
    if not os.path.lexists(path):
        return
    if not os.path.isdir(path) or os.path.islink(path):
        raise FileExistsError(f"{path} exists and is not a checkpoint directory; refusing to replace it")
    entries = sorted(os.listdir(path))
    if entries and MARKER not in entries and ".metadata" not in entries:
        raise FileExistsError(f"{path} holds files that are not a checkpoint (e.g. {entries[0]!r}); "
                              f"refusing to replace it")


def commit(tmp: str, path: str, manifest: dict) -> None:
    """Rank 0, after every rank's data is on disk: marker, then swap into place."""
    manifest["files"] = {f: os.path.getsize(os.path.join(tmp, f)) for f in sorted(os.listdir(tmp))}
    part = os.path.join(tmp, MARKER + ".part")
    with open(part, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(part, os.path.join(tmp, MARKER))
    _fsync_dir(tmp)
    old = None
    if os.path.lexists(path):
        check_replaceable(path)
        old = sibling(path, "old")
        os.rename(path, old)
    try:
        os.rename(tmp, path)
    except OSError:
        if old is not None:
            os.rename(old, path)  # put the previous checkpoint back
        raise
    _fsync_dir(os.path.dirname(path))
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
