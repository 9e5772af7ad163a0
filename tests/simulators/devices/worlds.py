"""Worlds on a mock device for the tests of ``simulators.devices``.

A mock device family installs itself into the process that imports it (it
takes torch's PrivateUse1 device and registers kernels), so the tests never
import ``torch_xla`` or ``torch_npu`` in the pytest process: they run probe
functions in the ranks of a `RankPool` whose import path starts with the
family's stand-in package, and assert on what the ranks return. A probe that
raises shows its rank's traceback.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Iterator

from simulators import RankPool, World
from simulators.devices import world_settings

Probe = Callable[..., Any]


class DeviceWorld:
    """A pool of ranks on the mock ``kind`` device; `run` calls a probe on every rank."""

    def __init__(self, kind: str, world: str) -> None:
        settings = world_settings(kind)
        self.pool = RankPool(World.parse(world), env=settings.env, pythonpath=[*settings.pythonpath, *sys.path])

    def run(self, probe: Probe, *args: Any, timeout: float = 60.0) -> list[Any]:
        """``probe(*args)`` on every rank; the values in rank order (a failing rank fails the test)."""
        result = self.pool.run(f"{probe.__module__}:{probe.__name__}", args, timeout=timeout)
        assert result.status == "ok", f"the ranks did not all answer ({result.status}): {result.stacks or result.exit_codes}"
        failed = [outcome.error for outcome in result.outcomes.values() if not outcome.ok]
        assert not failed, "a probe failed on a rank:\n" + "\n".join(failed)
        return [result.outcomes[rank].value for rank in sorted(result.outcomes)]

    def one(self, probe: Probe, *args: Any) -> Any:
        """The value of ``probe(*args)`` in a world of one rank."""
        (value,) = self.run(probe, *args)
        return value

    def close(self) -> None:
        self.pool.close()


def device_world(kind: str, world: str) -> Iterator[DeviceWorld]:
    """Body of a module-scoped fixture: a started `DeviceWorld`, closed afterwards."""
    started = DeviceWorld(kind, world)
    try:
        yield started
    finally:
        started.close()
