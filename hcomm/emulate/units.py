"""Human units in cluster specs: bandwidth, latency, memory.

YAML says ``100mbit``, ``10GB/s``, ``500us``, ``2GiB``; the API holds bytes
per second, seconds and bytes.  Bandwidth follows tc's convention that
``bit`` suffixes are bits and ``B`` suffixes are bytes, and SI prefixes are
powers of 1000 for rates (a 10 Gbit link is 10**10 bit/s); memory accepts both
``GB`` (10**9) and ``GiB`` (2**30), and ``B`` for plain bytes.  A bare number
means bytes/s, seconds or bytes here (the Python API's units); a spec file
must say its unit, which the spec loader checks.  Each parser raises ``ValueError`` with the text it could not read; the
spec loader adds the field name.
"""
from __future__ import annotations

import re
from typing import Union

Number = Union[int, float]

_SI = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_BIN = {"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_NUM = r"(\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"


def _number(value, what: str) -> float:
    if isinstance(value, bool):
        raise ValueError(f"expected a {what}, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    raise TypeError


def parse_bandwidth(value) -> float:
    """``"100mbit"``, ``"1gbit"``, ``"10GB/s"``, ``"150MiB/s"`` -> bytes/s."""
    try:
        return _number(value, "bandwidth")
    except TypeError:
        pass
    text = str(value).strip()
    # "bps" is deliberately refused: tc reads it as bytes, most people as bits.
    m = re.fullmatch(_NUM + r"\s*((?:[kKmMgGtT]i?)?)(bit|B)(?:/s)?", text)
    if not m:
        raise ValueError(
            f"cannot read bandwidth {value!r} (examples: 100mbit, 1gbit, 10GB/s, 150MB/s)")
    number = float(text[: m.start(2)].strip())
    prefix = m.group(2).lower()
    scale = _BIN[prefix] if prefix.endswith("i") else _SI[prefix]
    unit = m.group(3)
    per_byte = 1.0 if unit == "B" else 1.0 / 8.0
    return number * scale * per_byte


def parse_latency(value) -> float:
    """``"500us"``, ``"1ms"``, ``"0.2 ms"``, ``"1s"`` -> seconds."""
    try:
        return _number(value, "latency")
    except TypeError:
        pass
    text = str(value).strip()
    m = re.fullmatch(_NUM + r"\s*(ns|us|µs|ms|s)", text)
    if not m:
        raise ValueError(f"cannot read latency {value!r} (examples: 200us, 1ms, 0.5ms)")
    number = float(text[: m.start(2)].strip())
    return number * {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}[m.group(2)]


def parse_memory(value) -> int:
    """``"2GiB"``, ``"512MiB"``, ``"16GB"`` or a byte count -> bytes."""
    if isinstance(value, bool):
        raise ValueError(f"expected a memory size, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    text = str(value).strip()
    m = re.fullmatch(_NUM + r"\s*((?:[kKmMgGtT]i?)?)B?", text)
    if not m or (m.group(2) == "" and not text.rstrip("B").strip().replace(".", "").isdigit()):
        raise ValueError(f"cannot read memory size {value!r} (examples: 2GiB, 512MiB, 16GB)")
    number = float(text[: m.start(2)].strip()) if m.group(2) else float(text.rstrip("B").strip())
    prefix = m.group(2).lower()
    scale = _BIN[prefix] if prefix.endswith("i") else _SI[prefix]
    return int(number * scale)


def fmt_bandwidth(bytes_per_s: float) -> str:
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:.3g} {unit}"
    return f"{bytes_per_s:.3g} B/s"


def fmt_latency(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


def fmt_memory(nbytes: int) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} B"


def tc_rate(bytes_per_s: float) -> str:
    """The rate argument tc wants (bits per second, integer)."""
    return f"{int(round(bytes_per_s * 8))}bit"
