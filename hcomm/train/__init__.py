"""The parallel-training layer built on hcomm: the trainer, its data (corpus,
tokenizers and the rank-independent global sample order), the command-line
entry point and the run reports."""
