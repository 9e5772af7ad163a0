"""Worlds of ranks and the torchrun environment each rank sees.

A world is ``machines`` simulated machines with ``ranks_per_machine`` ranks
each. Ranks are numbered machine by machine, so rank ``r`` lives on machine
``r // ranks_per_machine`` with local rank ``r % ranks_per_machine``.
"""
from __future__ import annotations

from dataclasses import dataclass

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class World:
    """``machines`` simulated machines of ``ranks_per_machine`` ranks each."""

    machines: int
    ranks_per_machine: int

    def __post_init__(self) -> None:
        if self.machines < 1:
            raise ValueError(f"a world needs at least 1 machine, got machines={self.machines}")
        if self.ranks_per_machine < 1:
            raise ValueError(
                f"a world needs at least 1 rank per machine, got ranks_per_machine={self.ranks_per_machine}"
            )

    @property
    def size(self) -> int:
        """Number of ranks in the world (torchrun's WORLD_SIZE)."""
        return self.machines * self.ranks_per_machine

    @property
    def label(self) -> str:
        """``"4"`` for one machine of 4 ranks, ``"2x2"`` for 2 machines of 2 ranks."""
        if self.machines == 1:
            return str(self.ranks_per_machine)
        return f"{self.machines}x{self.ranks_per_machine}"

    @classmethod
    def of(cls, size: int, machines: int = 1) -> World:
        """The world of ``size`` ranks spread evenly over ``machines`` machines."""
        if size < 1:
            raise ValueError(f"world size must be at least 1, got size={size}")
        if machines < 1:
            raise ValueError(f"a world needs at least 1 machine, got machines={machines}")
        if size % machines:
            raise ValueError(
                f"world size {size} does not divide evenly among {machines} machines"
            )
        return cls(machines=machines, ranks_per_machine=size // machines)

    @classmethod
    def parse(cls, text: str) -> World:
        """Parse a label: ``"4"`` (one machine, 4 ranks) or ``"2x2"`` (machines x ranks per machine)."""
        parts = text.strip().lower().split("x")
        try:
            numbers = [int(part) for part in parts]
        except ValueError:
            raise ValueError(f"bad world {text!r}: expected N or MxN, e.g. '4' or '2x2'") from None
        if len(numbers) == 1:
            return cls.of(numbers[0])
        if len(numbers) == 2:
            return cls(machines=numbers[0], ranks_per_machine=numbers[1])
        raise ValueError(f"bad world {text!r}: expected N or MxN, e.g. '4' or '2x2'")


def rank_env(world: World, rank: int, master_port: int) -> dict[str, str]:
    """The torchrun environment of ``rank`` in ``world``, rendezvous on loopback at ``master_port``.

    Also sets ``OMP_NUM_THREADS=1`` (N ranks share the cores; callers override
    it through their own env) and ``PYTHONUNBUFFERED=1`` so output arrives as
    it is written.
    """
    if not 0 <= rank < world.size:
        raise ValueError(f"rank {rank} is outside a world of size {world.size}")
    machine, local_rank = divmod(rank, world.ranks_per_machine)
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world.size),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(world.ranks_per_machine),
        "NODE_RANK": str(machine),
        "GROUP_RANK": str(machine),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world.size),
        "MASTER_ADDR": LOOPBACK,
        "MASTER_PORT": str(master_port),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }
