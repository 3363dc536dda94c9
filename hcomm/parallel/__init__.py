"""hcomm's training layer: how a model is split across a heterogeneous cluster.

- ``plan``: the :class:`Plan`, the one object holding every parallel decision
  (batch shares, pipeline stages, tensor/ZeRO splits, dtypes, per-group
  buckets, compression and sync period); readable and writable as YAML.
- cluster + device profiles, data parallelism with uneven batches.
- later: ``zero/``, ``pipeline/``, tensor parallelism, precision, ``planner/``.

Each dimension reads only its own part of the plan.  Importing this package
stays light: the plan module needs no torch.
"""
from hcomm.parallel.plan import GroupPlan, Plan, PlanError, RankPlan

__all__ = ["Plan", "RankPlan", "GroupPlan", "PlanError"]
