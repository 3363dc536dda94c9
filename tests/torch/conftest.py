"""Worker pools shared by the multi-process tier.

`pool` is one set of 4 worker processes for the whole session (default gloo
group + hcomm groups over ranks [0, k) for k = 1..4); modules that need a
differently initialised world (faults, init methods) start their own small
pool and close it.
"""
import pytest

from tests.helpers.mp import Pool

WORLD = 4


@pytest.fixture(scope="session")
def pool():
    p = Pool(WORLD, setup="groups")
    yield p
    p.close()
