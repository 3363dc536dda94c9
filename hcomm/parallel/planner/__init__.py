"""The planner: one cost model (``cost``) and the searches that use it.

``data.plan_data_parallel`` chooses batch shares, micro-batches and bucket
sizes; the pipeline, tensor-parallel, ZeRO and precision searches join it
here and the joint search over all of them comes last.
"""
