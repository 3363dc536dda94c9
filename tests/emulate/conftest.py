"""Shared fixtures: skip emulator tests with a reason, clean up even on failure."""
import os

import pytest

from hcomm.emulate import preflight, state


def _missing():
    try:
        return preflight.missing()
    except Exception as exc:  # a probe itself failing is also a reason to skip
        return [f"preflight failed: {exc}"]


@pytest.fixture
def emulator():
    """Skips without root/tools; afterwards removes anything a test left behind."""
    missing = _missing()
    if missing:
        pytest.skip("emulator unavailable: " + "; ".join(missing))
    before = set(state.known_run_ids())
    yield
    for run_id in set(state.known_run_ids()) - before:
        st = state.read_state(run_id)
        if st is None or st.get("pid") == os.getpid() or not state.is_live(st):
            state.teardown(run_id)
