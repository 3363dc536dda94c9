"""hcomm's training layer: how a model is split across a heterogeneous cluster.

- ``plan``: the :class:`Plan`, the one object holding every parallel decision
  (batch shares, pipeline stages, tensor/ZeRO splits, dtypes, per-group
  buckets, compression and sync period); readable and writable as YAML.
- cluster + device profiles; the dimensions: data parallelism with uneven
  batches (``data``), ``zero/``, ``pipeline/``, ``tensor/``, ``precision``;
- ``planner/``: one cost model, each dimension's builder, ``simulate`` (the
  predicted step and memory of any plan) and ``search`` (all dimensions).

Each dimension reads only its own part of the plan.  Importing this package
stays light: the plan module needs no torch.
"""
from hcomm.parallel.plan import GroupPlan, Plan, PlanError, RankPlan


def simulate(plan, view, **kwargs):
    """Predicted step seconds and per-rank memory of ``plan`` on ``view`` (``planner/simulate.py``)."""
    from hcomm.parallel.planner.simulate import simulate as run

    return run(plan, view, **kwargs)


__all__ = ["Plan", "RankPlan", "GroupPlan", "PlanError", "simulate"]
