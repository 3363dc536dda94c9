"""Worker pools shared by the multi-process training-layer tests (one per test module: a pool
that a test broke does not spill into the next module)."""
import pytest

from tests.helpers.mp import Pool


@pytest.fixture(scope="module")
def pool3():
    p = Pool(3, setup="bare")
    yield p
    p.close()


@pytest.fixture(scope="module")
def pool4():
    p = Pool(4, setup="bare")
    yield p
    p.close()
