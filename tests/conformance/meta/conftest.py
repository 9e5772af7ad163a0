"""Fixtures of the meta-tests: each module gets its own pool of ranks shared by its entries."""

from __future__ import annotations

import pytest

from tests.conformance.meta.support import SharedPools


@pytest.fixture(scope="module")
def shared_pools(tmp_path_factory):
    """One `SharedPools` over the plain CPU simulator for the module's entries (modules on a mock device define their own)."""
    pools = SharedPools(tmp_path_factory.mktemp("switchboard") / "choice")
    yield pools
    pools.close()
