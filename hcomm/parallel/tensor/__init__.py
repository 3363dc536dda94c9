"""Non-uniform tensor parallelism: shards of any size (see ``parallelize.tensor_parallelize``)."""
