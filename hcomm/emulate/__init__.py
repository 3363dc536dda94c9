"""A heterogeneous cluster emulated on one Linux box.

Per node a network namespace whose uplink is rate-limited with ``tc tbf``
(both directions) and delayed by a user-space wire; per rank a cgroup whose
CPU quota follows its relative speed and whose memory limit is its emulated
device memory; one ``torchrun`` per node.  See ``docs/emulate.md``.

Nothing is created at import time.
"""
from hcomm.emulate.cluster import Cluster, EmulatorUnavailable  # noqa: F401
from hcomm.emulate.launch import run, run_on  # noqa: F401
from hcomm.emulate.catalog import DEFAULT_PRESET, presets  # noqa: F401
from hcomm.emulate.spec import ClusterSpec, NodeSpec, RankSpec, SpecError, load_spec  # noqa: F401
