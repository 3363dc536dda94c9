"""Built-in cluster presets (the catalog), one YAML file each under ``presets/``.

Presets are plain spec files so users can copy one as the start of their own
(``hcomm emulate show --cluster uneven`` prints where it lives).
"""
from __future__ import annotations

import os
from typing import List

DEFAULT_PRESET = "mixed"
_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "presets")


def presets() -> List[str]:
    """Names of the built-in presets."""
    return sorted(f[: -len(".yaml")] for f in os.listdir(_DIR) if f.endswith(".yaml"))


def preset_path(name: str) -> str:
    return os.path.join(_DIR, f"{name}.yaml")
