"""Uneven pipeline parallelism: partition layers by measured speed and memory, schedule micro-batches, run stages."""
