"""hcomm: collectives and parallel training for heterogeneous clusters.

Importing hcomm registers the ``hcomm`` torch.distributed backend and does
nothing else (no environment changes, no patching of torch).
"""
__version__ = "0.1.0"

import torch  # noqa: F401  (hcomm._C links against libtorch; load it first)

from hcomm.errors import HCommError, HCommValueError  # noqa: F401
