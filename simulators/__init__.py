"""Run N ranks on one machine, as M simulated machines, with gloo on loopback.

Knows nothing of any implementation under test: it starts any Python code
that follows the torchrun environment contract (RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR, MASTER_PORT).

- :func:`launch` runs a script on every rank (also ``python -m simulators launch``);
- :func:`run` calls a function on every rank and returns the values;
- :class:`RankPool` keeps ranks alive across many targets (the conformance suite's engine).
"""
from simulators.launcher import LaunchResult, RankFailure, RankTimeout, launch, run
from simulators.outcome import RankOutcome
from simulators.pool import PoolResult, PoolStartError, RankPool
from simulators.topology import World

__all__ = [
    "LaunchResult",
    "PoolResult",
    "PoolStartError",
    "RankFailure",
    "RankOutcome",
    "RankPool",
    "RankTimeout",
    "World",
    "launch",
    "run",
]
