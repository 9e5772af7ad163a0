"""The case model: a function run on every rank of a world, tagged with a catalog ID.

```python
@case("reduce.doc_example", worlds=[2])
def reduce_doc_example(impl, world):
    acc = impl.Accelerator()
    t = torch.arange(acc.num_processes) + 1 + 2 * acc.process_index
    assert acc.reduce(t.to(acc.device), reduction="sum").tolist() == [4, 6]
```

A case may return a picklable value from each rank; a function registered
with ``@<case>.check`` then receives every rank's value on the driver and
asserts across ranks there, over the control channel, so a broken collective
in the implementation cannot hide the failure it is meant to reveal.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from simulators.topology import World

from . import levels

#: Worlds a rule "makes sense at" when its catalog row says "any".
ANY_WORLD: tuple[str, ...] = ("1", "2", "3", "4", "2x2", "2x4")
#: Seconds a case gets in a run that sets no other timeout, unless the case asks for more.
DEFAULT_CASE_TIMEOUT = 6.0
#: The ``--worlds large`` preset: one machine of 16, 4 machines of 8, 8 of 8 (issue 14).
LARGE_WORLDS: tuple[str, ...] = ("16", "4x8", "8x8")
#: Catalog areas whose world-generic cases (those that run at 2x4) also run at LARGE_WORLDS.
LARGE_AREAS: tuple[str, ...] = ("Collectives", "Inference helpers", "Data loading")

CaseFunction = Callable[[Any, "WorldInfo"], Any]
CheckFunction = Callable[[list, "WorldInfo"], None]


@dataclass(frozen=True)
class WorldInfo:
    """The world a case runs in, as the case sees it."""

    world: World
    #: A directory every rank of this case run shares (fresh for each case run).
    shared_dir: str = ""

    @property
    def machines(self) -> int:
        return self.world.machines

    @property
    def ranks_per_machine(self) -> int:
        return self.world.ranks_per_machine

    @property
    def size(self) -> int:
        return self.world.size

    @property
    def label(self) -> str:
        return self.world.label

    @property
    def rank(self) -> int:
        """This rank's index as the launcher assigned it (the truth cases compare against)."""
        return int(os.environ.get("RANK", "0"))

    @property
    def local_rank(self) -> int:
        return self.rank % self.ranks_per_machine

    @property
    def machine(self) -> int:
        return self.rank // self.ranks_per_machine

    def local_ranks_of(self, local_rank: int) -> list[bool]:
        """For each rank of the world, whether its local index is ``local_rank``."""
        return [rank % self.ranks_per_machine == local_rank for rank in range(self.size)]

    @classmethod
    def parse(cls, label: str, shared_dir: str = "") -> "WorldInfo":
        """``"4"`` is one machine of 4 ranks; ``"2x2"`` two machines of 2."""
        return cls(World.parse(str(label)), shared_dir)


@dataclass
class Case:
    """One conformance case."""

    id: str
    function: CaseFunction
    worlds: tuple[str, ...]
    check_function: CheckFunction | None = None
    #: Extra environment set in every rank for the duration of the case (the
    #: implementation's state is created afresh for each case, so variables
    #: read at state creation, such as ``ACCELERATE_DEBUG_MODE``, take effect).
    env: dict[str, str] = field(default_factory=dict)
    #: The device family the case is about (``"xla"``, ``"npu"``), or None for a
    #: case of every device: simulated backends run it only on that family's mock.
    device: str | None = None
    #: Seconds this case may take before it is a HANG, when it needs more than
    #: the run's ``--case-timeout`` (which still applies if larger).
    timeout: float | None = None
    #: What the case's rule rests on (:mod:`.levels`): ``docs-0.27``, ``docs-1.x`` or ``hf-1.15``.
    level: str = levels.LEVELS[0]
    #: Modules the case reaches that take seconds per rank to import on first use (``torch._dynamo``,
    #: ``deepspeed``): a simulated backend's fork server imports them once for all its ranks.
    imports: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.function.__name__

    @property
    def key(self) -> str:
        """A stable handle ``module:function`` by which ranks find the case."""
        return f"{self.function.__module__}:{self.function.__name__}"

    def timeout_within(self, run_timeout: float) -> float:
        """The seconds this case gets in a run whose case timeout is ``run_timeout``."""
        return max(run_timeout, self.timeout or 0.0)

    def runs_at(self, world: str) -> bool:
        """Whether the case runs at ``world``: one it lists, or a large world for a world-generic case of LARGE_AREAS."""
        return world in self.worlds or (world in LARGE_WORLDS and self.scales)

    @property
    def scales(self) -> bool:
        """A case of LARGE_AREAS written for any world (it runs at 2x4) runs at the large worlds too."""
        from .. import catalog

        return "2x4" in self.worlds and catalog.area_of(self.id) in LARGE_AREAS

    def check(self, function: CheckFunction) -> CheckFunction:
        """Register the driver-side check of this case's per-rank values."""
        self.check_function = function
        return function


_REGISTRY: dict[str, Case] = {}


def case(
    catalog_id: str,
    worlds: Iterable[int | str] = ANY_WORLD,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    device: str | None = None,
    level: str | None = None,
    imports: Iterable[str] = (),
) -> Callable[[CaseFunction], Case]:
    """Register ``function`` as a case for ``catalog_id`` at ``worlds`` (on ``device`` only, if given), resting on
    ``level`` (default: :func:`.levels.of_case`); ``imports``: see :attr:`Case.imports`."""
    labels = tuple(World.parse(str(world)).label for world in worlds)

    def register(function: CaseFunction) -> Case:
        key = f"{function.__module__}:{function.__name__}"
        rests_on = levels.parse(level) if level else levels.of_case(catalog_id, key)
        registered = Case(catalog_id, function, labels, env=dict(env or {}), timeout=timeout, device=device,
                          level=rests_on, imports=tuple(imports))
        if registered.key in _REGISTRY:
            raise ValueError(f"case {registered.key} registered twice")
        _REGISTRY[registered.key] = registered
        return registered

    return register


def all_cases() -> list[Case]:
    """Every case of the suite (the modules of `conformance.cases`), importing them first.

    Cases registered from elsewhere (a test's fixtures) are not part of the suite.
    """
    from .. import cases

    cases.load_all()
    return [c for c in _REGISTRY.values() if c.function.__module__.startswith(f"{cases.__name__}.")]


def find(key: str) -> Case:
    """The case registered under ``key`` (``module:function``), importing its module."""
    if key not in _REGISTRY:
        import importlib

        importlib.import_module(key.partition(":")[0])
    return _REGISTRY[key]


def select(cases: Sequence[Case], patterns: Sequence[str]) -> list[Case]:
    """Cases whose ID or name matches any of the shell-style ``patterns`` (all when none)."""
    if not patterns:
        return list(cases)
    from fnmatch import fnmatchcase

    return [c for c in cases if any(fnmatchcase(c.id, p) or fnmatchcase(c.name, p) for p in patterns)]


class NotSupported(Exception):
    """Raised by a case when the implementation lacks an optional feature."""
