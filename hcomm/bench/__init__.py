"""hcomm bench and hcomm topo: nccl-tests style benchmarks and the measured link matrix.

See ``benchmarks/README.md`` for how to run them and how results are recorded.
"""
