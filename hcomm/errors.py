"""The one error type hcomm raises for failed communication.

Bad arguments raise ``ValueError`` (or :class:`HCommValueError`, which is
both a ``ValueError`` and an ``HCommError``); failures during communication
(a dead peer, a timeout, a mismatch found by ``HCOMM_DEBUG``) raise
:class:`HCommError`.  The messages name the op, dtype, sizes and rank.
"""


class HCommError(RuntimeError):
    """A collective failed: timeout, dead peer, mismatched calls, bad state."""


class HCommValueError(HCommError, ValueError):
    """A collective was called with arguments that cannot be right."""
