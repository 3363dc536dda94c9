"""Stragglers: a rank that has become slower (or faster) than the batch split assumes.

A plan splits the batch by each rank's speed, but speeds drift in training: a throttled or shared
device, a neighbour's job on the same host, an emulated rank whose CPU quota changed.  Every step
each rank's compute seconds per sample are compared with the baseline that rank showed right after
the last (re)split; when some rank stays more than ``margin`` away from it for ``patience`` steps in
a row, the trainer re-splits the batch by the seconds per sample just measured, at the next step
boundary -- data parallelism's checkpoint boundary: no state moves, only rows, so no progress is lost.

Why a baseline measured in training and not the profile: the profile times pieces alone, before
training; in training a rank's own communication threads share its device (on the emulator, its CPU
quota), so the profile is off by a steady factor that is not drift (``train.loop`` re-splits once after
the first steps for exactly that, and the watch starts after it).

What it sees is each rank's forward + backward wall time.  On an oversubscribed CPU box a rank's
communication threads polling for a slow peer can slow its own backward too (gradient buckets launch
during backward), so there a fast rank can look slow as well; on accelerators the compute runs on the
device and this does not arise.  The margin and patience keep one noisy step from re-splitting.

``StragglerWatch`` only decides; it holds no collective and no model, so it is tested alone.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import List, Optional, Sequence


@dataclass
class StragglerWatch:
    margin: float = 0.3     # relative drift of seconds per sample that counts as a straggler (0 = never)
    patience: int = 3       # steps in a row beyond the margin before re-planning
    # steps after a (re)split that set the baseline, by their median: three, so one hiccup among them
    # (a 600 ms stall was seen on a loaded 2-core box) cannot inflate it -- the median of two is a mean
    settle: int = 3
    _seen: List[List[float]] = field(default_factory=list)
    _baseline: Optional[List[float]] = None
    _streak: List[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.margin < 0:
            raise ValueError(f"straggler margin must be >= 0 (0 = never re-plan), got {self.margin}")
        if self.patience < 1 or self.settle < 1:
            raise ValueError(f"straggler patience and settle must be >= 1, got {self.patience} and {self.settle}")

    def observe(self, per_sample: Sequence[float]) -> Optional[List[int]]:
        """One step's seconds per sample of every rank (nan for a rank that ran no samples).  Returns
        the ranks that drifted when it is time to re-split, else None; after a re-split the caller
        calls ``reset`` so the next steps set a new baseline."""
        if not self.margin:
            return None
        if self._baseline is None:
            self._seen.append(list(per_sample))
            if len(self._seen) >= self.settle:
                self._baseline = [statistics.median(column) for column in zip(*self._seen)]
                self._streak = [0] * len(per_sample)
            return None
        drifted = []
        for r, (now, base) in enumerate(zip(per_sample, self._baseline)):
            if math.isnan(now) or math.isnan(base) or base <= 0:
                continue
            self._streak[r] = self._streak[r] + 1 if abs(now / base - 1.0) > self.margin else 0
            if self._streak[r] >= self.patience:
                drifted.append(r)
        return drifted or None

    def drift(self, per_sample: Sequence[float]) -> List[float]:
        """Each rank's relative drift from its baseline (nan where unknown)."""
        if self._baseline is None:
            return [math.nan] * len(per_sample)
        return [now / base - 1.0 if base > 0 and not math.isnan(base) else math.nan
                for now, base in zip(per_sample, self._baseline)]

    def reset(self) -> None:
        self._seen, self._baseline, self._streak = [], None, []
