"""The text table, in nccl-tests' layout plus backend, ratio and algorithm columns.

Columns up to ``busbw #wrong`` are nccl-tests' (so their parsers and eyes
work); one row per (size, backend), the backends of one size next to each
other.  ``ratio`` is this row's busbw over the first backend's at the same
size.  Per-tier figures go on a ``#`` continuation line under the row, so
the row format stays fixed and comment-skipping parsers ignore them.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List

# (label, unit, width) of every fixed column; rows use the same widths
_COLUMNS = [("size", "(B)", 12), ("count", "(elements)", 12), ("type", "", 8), ("redop", "", 6),
            ("root", "", 6), ("backend", "", 8), ("time", "(us)", 9), ("algbw", "(GB/s)", 7),
            ("busbw", "(GB/s)", 7), ("#wrong", "", 6), ("ratio", "(vs 1st)", 8)]


def _header_line(cells) -> str:
    text = "  ".join(f"{c:>{w}}" for c, (_, _, w) in zip(cells, _COLUMNS))
    return "#" + text[1:]  # the leading '#' takes the place of a padding blank


def _time(us: float) -> str:
    # nccl-tests' precision rule: fewer decimals as the number grows
    if us >= 10000:
        return f"{us:9.0f}"
    if us >= 100:
        return f"{us:9.1f}"
    return f"{us:9.2f}"


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024.0
    return f"{n:.2f} GB"


def header(base: str) -> List[str]:
    labels = [label for label, _, _ in _COLUMNS]
    units = [unit.format(base=base) for _, unit, _ in _COLUMNS]
    return [_header_line(labels) + "  algorithm", _header_line(units)]


def row(r: Dict[str, Any]) -> str:
    ratio = "-" if r.get("ratio") is None else f"{r['ratio']:7.2f}x"
    return (f"{r['size_bytes']:12d}  {r['count']:12d}  {r['dtype']:>8}  {r['redop']:>6}  {r['root']:6d}"
            f"  {r['backend']:>8}  {_time(r['time_us'])}  {r['algbw_gbps']:7.3f}  {r['busbw_gbps']:7.3f}"
            f"  {r['wrong']:6d}  {ratio:>8}  {r.get('algorithm') or '-'}")


def tier_line(r: Dict[str, Any]) -> str:
    tiers = r.get("tiers") or []
    # a single untimed tier (a flat algorithm) says nothing the row does not; it stays in the JSON
    if len(tiers) < 2 and not any(t.get("seconds") for t in tiers):
        return ""
    parts = []
    for t in tiers:
        rate = "-" if t.get("gbps") is None else f"{t['gbps']:.3f} GB/s"
        parts.append(f"{t['tier']} {human_bytes(t['bytes'])} in {t['seconds'] * 1e6:.1f} us = {rate}")
    return "#        tiers: " + " | ".join(parts) if parts else ""


def lines_for(r: Dict[str, Any]) -> List[str]:
    out = [row(r)]
    tiers = tier_line(r)
    if tiers:
        out.append(tiers)
    return out


def summary(records: List[Dict[str, Any]], backends: List[str]) -> List[str]:
    lines = []
    wrong = sum(r["wrong"] for r in records)
    lines.append(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    for b in backends:
        mine = [r for r in records if r["backend"] == b]
        if not mine:
            continue
        avg = sum(r["busbw_gbps"] for r in mine) / len(mine)
        peak = max(mine, key=lambda r: r["busbw_gbps"])
        lines.append(f"# {b:>8}: avg busbw {avg:.3f} GB/s over {len(mine)} sizes, peak {peak['busbw_gbps']:.3f}"
                     f" GB/s at {human_bytes(peak['size_bytes'])}")
    base = backends[0]
    for b in backends[1:]:
        ratios = [r for r in records if r["backend"] == b and r.get("ratio")]
        if not ratios:
            continue
        geo = math.exp(sum(math.log(r["ratio"]) for r in ratios) / len(ratios))
        lo = min(ratios, key=lambda r: r["ratio"])
        hi = max(ratios, key=lambda r: r["ratio"])
        lines.append(f"# {b}/{base} busbw ratio: geomean {geo:.2f}x, min {lo['ratio']:.2f}x at "
                     f"{human_bytes(lo['size_bytes'])}, max {hi['ratio']:.2f}x at {human_bytes(hi['size_bytes'])}")
    return lines


def render(records: List[Dict[str, Any]], backends: List[str], preamble: List[str] = ()) -> str:
    out = list(preamble) + header(backends[0])
    for r in records:
        out.extend(lines_for(r))
    out.extend(summary(records, backends))
    return "\n".join(out)
