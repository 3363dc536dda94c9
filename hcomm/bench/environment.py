"""Machine, versions and per-rank placement, recorded with every result.

A bandwidth figure without the machine and versions behind it cannot be
compared with anything, so JSON and markdown results carry all three.
"""
from __future__ import annotations

import datetime
import os
import platform
import socket
import subprocess
import sys
from typing import Any, Dict

import torch


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def machine() -> Dict[str, Any]:
    info: Dict[str, Any] = {
        "hostname": socket.gethostname(), "cpu_model": cpu_model(),
        "nproc": os.cpu_count() or 0, "memory_bytes": memory_bytes(),
        "platform": platform.platform(), "gpus": [],
    }
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def git_revision() -> str:
    """hcomm's git revision (with '-dirty' for local changes), or 'unknown'."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        rev = subprocess.run(["git", "-C", here, "rev-parse", "--short=12", "HEAD"],
                             capture_output=True, text=True, timeout=5)
        if rev.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return rev.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def versions() -> Dict[str, Any]:
    import hcomm

    out: Dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__,
        "hcomm": getattr(hcomm, "__version__", "unknown"), "hcomm_git": git_revision(),
        "cuda": torch.version.cuda, "nccl": None,
    }
    if torch.cuda.is_available():
        try:
            out["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:
            pass
    return out


def rank_info(rank: int, device: torch.device) -> Dict[str, Any]:
    """Where this rank runs; ``HCOMM_EMU_ISLAND`` is set by ``hcomm emulate run``."""
    dev = str(device)
    if device.type == "cuda":
        dev = f"{dev} ({torch.cuda.get_device_name(device)})"
    host = socket.gethostname()
    node, kind = os.environ.get("HCOMM_EMU_NODE"), os.environ.get("HCOMM_EMU_DEVICE")
    if node:  # under hcomm emulate run every rank shares one host: name what it stands for
        host = f"{node} (emulated)"
    if kind:
        dev = f"{kind} (emulated on {dev})"
    return {"rank": rank, "host": host,
            "island": os.environ.get("HCOMM_EMU_ISLAND") or None, "device": dev}


def today() -> str:
    return datetime.date.today().isoformat()


def now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def command_line(argv) -> str:
    return " ".join(["hcomm", *argv]) if argv else " ".join(sys.argv)
