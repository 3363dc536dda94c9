"""Heterogeneous ZeRO: uneven shards sized by memory, prefetch, optimizer on shards, resharding checkpoints."""
