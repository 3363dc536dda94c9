"""Every ``HCOMM_*`` setting, declared once beside the code that uses it.

A module declares its settings with :func:`declare` at import time, the way
NCCL's ``NCCL_PARAM`` does; ``hcomm settings`` (and the README table) list
all of them from this registry, so the documentation cannot drift from the
code.  Values are read from the environment each time :meth:`Setting.get` is
called, so a test can change them with ``monkeypatch.setenv``.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

_REGISTRY: Dict[str, "Setting"] = {}


def _parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected a boolean (0/1/true/false), got {text!r}")


_PARSERS: Dict[type, Callable[[str], object]] = {
    bool: _parse_bool,
    int: int,
    float: float,
    str: str,
}


@dataclass(frozen=True)
class Setting:
    name: str
    default: object
    help: str
    kind: type = str
    module: str = ""

    def raw(self) -> Optional[str]:
        return os.environ.get(self.name)

    def get(self):
        text = self.raw()
        if text is None or text == "":
            return self.default
        try:
            return _PARSERS[self.kind](text)
        except ValueError as exc:
            raise ValueError(f"{self.name}={text!r}: {exc}") from None


def declare(name: str, default, help: str, kind: Optional[type] = None) -> Setting:
    """Declare a setting; declaring the same name twice must agree."""
    if not name.startswith("HCOMM_"):
        raise ValueError(f"hcomm settings start with HCOMM_, got {name!r}")
    kind = kind or (type(default) if default is not None else str)
    # the caller's frame only: inspect.stack() read every frame's source line, ~12 ms a call and 0.3 s
    # of every process's ``import hcomm``
    caller = sys._getframe(1).f_globals.get("__name__", "")
    setting = Setting(name, default, help, kind, caller)
    old = _REGISTRY.get(name)
    if old is not None and (old.default, old.kind) != (default, kind):
        raise ValueError(f"setting {name} declared twice with different defaults")
    _REGISTRY.setdefault(name, setting)
    return _REGISTRY[name]


def all_settings() -> List[Setting]:
    """All declared settings, importing every module that declares some."""
    import importlib
    import pkgutil

    import hcomm

    for info in pkgutil.walk_packages(hcomm.__path__, "hcomm."):
        if info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except ImportError:
            continue  # a part whose optional dependency is missing
    return sorted(_REGISTRY.values(), key=lambda s: s.name)


def markdown_table() -> str:
    rows = ["| setting | default | meaning |", "| --- | --- | --- |"]
    for s in all_settings():
        default = "(unset)" if s.default in (None, "") else f"`{s.default}`"
        rows.append(f"| `{s.name}` | {default} | {s.help} |")
    return "\n".join(rows)


def effective_table() -> str:
    """The table ``hcomm settings`` prints: the default and the value in effect here."""
    rows = ["| setting | in effect | default | meaning |", "| --- | --- | --- | --- |"]
    for s in all_settings():
        default = "(unset)" if s.default in (None, "") else f"`{s.default}`"
        raw = s.raw()
        effect = f"`{raw}` (set)" if raw not in (None, "") else default
        rows.append(f"| `{s.name}` | {effect} | {default} | {s.help} |")
    return "\n".join(rows)


# Read by setup.py at build time (setup.py cannot import the package it builds);
# declared here so it is documented with the rest.
HCOMM_BUILD_CUDA = declare(
    "HCOMM_BUILD_CUDA", "auto",
    "build time (setup.py): 0 forces a CPU-only build, 1 makes a missing CUDA toolkit an error")
