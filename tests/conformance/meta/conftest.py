"""Fixtures of the meta-tests: each module gets its own pool of ranks shared by its entries."""

from __future__ import annotations

from tests.conformance.meta.support import pools_fixture

shared_pools = pools_fixture()
