"""The planner: one cost model and everything that chooses with it.

``cost`` (data-parallel step), ``pipeline/partition`` (schedules) and the
comm layer's collective costs are the model; ``data``, ``zero``,
``pipeline``, ``tensor`` and ``pipeline_tensor`` build each dimension's plan
with it; ``simulate`` predicts any plan's step and memory from the plan alone
(the builders' predictions equal it); ``search`` runs the builders over every
combination of dimensions and ranks the results; ``offline`` / ``figures``
give a view of a cluster that cannot be measured.
"""
