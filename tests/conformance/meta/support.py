"""What the meta-tests share: a `Break` (a broken implementation, the cases to run and how the suite must
report it), plans of breaks with their reference controls, pools shared through `broken_impls.switchboard`,
and `judge`, the one judgement every area's meta-test applies.

Design rule (shared/DESIGN.md, "Rules of thumb"): a case must fail on an implementation that breaks its rule.
Each module of ``tests/conformance/meta/broken_impls`` breaks one rule; the ``test_<area>.py`` modules beside
this one list the breaks of their area and run each against the cases of that area, at the smallest world
where the break shows (see `test_suite` for the statuses expected and the speed rules). The
``broken_impls`` package is importable as a top-level package because pytest's ``pythonpath`` setting
(pyproject.toml) puts this folder on ``sys.path``, which the rank pool passes on to the ranks.
"""

from __future__ import annotations

import ast
import importlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import pytest
from broken_impls import switchboard

from conformance.engine.backends import SimBackend
from conformance.engine.case import all_cases, select
from conformance.engine.results import CaseResult, Status
from conformance.engine.runner import DEFAULT_CASE_TIMEOUT, RunOptions, execute
from simulators.topology import World

META_DIR = Path(__file__).resolve().parent

F, E, H, C = Status.FAIL, Status.ERROR, Status.HANG, Status.CRASH
REFERENCE = "accelerate_ref"
#: Meta-tests judge the status the suite gives a break; a HANG's confirming second run (tests/conformance/
#: test_runner.py proves it) would only double the time of the breaks that hang.
CONFIRM_HANGS = False

#: Case selections, by area, as conformance patterns over IDs.
PROCESS = ("state.attributes", "print.*", "process.*", "sync.*", "trigger.*")
#: Apart from PROCESS: its case starts torchrun, seconds that the other process breaks need not pay.
EXIT = ("state.clean_exit",)
COLLECTIVES = ("gather.*", "gather_object.*", "reduce.*", "pad.*", "broadcast.*", "broadcast_object_list.*", "debug.*")
OPS = ("ops.*",)
INFERENCE = ("split.*",)
METRICS = ("gather_for_metrics.*",)
UTILITIES = ("constants.*", "enums.*", "env.*", "mixed_precision.*", "cpu.*")
COMPAT = ("compat.*",)


@dataclass(frozen=True)
class Break:
    """One implementation run against a selection of cases, and how the suite must report it."""

    #: ``broken_impls.<name>``, or the reference for a control entry.
    impl: str
    #: Catalog ID (or, to be specific where an ID has several cases, a case's function name)
    #: -> statuses that count as caught.
    caught: dict[str, frozenset[Status]]
    world: str
    patterns: tuple[str, ...]
    #: IDs that rest on the broken rule and may fail too; any other ID must pass.
    collateral: frozenset[str] = frozenset()
    #: Run through `execute` with pools of its own instead of the shared switchboard pool.
    isolated: bool = False
    case_timeout: float = DEFAULT_CASE_TIMEOUT
    #: A known weakness of the suite that keeps this break from being reported as
    #: it should be: the entry is an expected failure (strict, so a fix shows up).
    known_gap: str = ""
    #: The break shows only on a machine with CUDA (skipped elsewhere).
    needs_cuda: bool = False

    @property
    def name(self) -> str:
        return self.impl.rpartition(".")[2]

    @property
    def label(self) -> str:
        return f"{self.name}@{self.world}"


def brk(module: str, caught, world: str, patterns: Iterable[str], collateral=(), **options) -> Break:
    """A `Break` of ``broken_impls.<module>``, ``caught`` given as ``{id: status or (statuses)}``."""
    as_sets = {
        cid: frozenset(statuses if isinstance(statuses, (tuple, set, frozenset)) else (statuses,))
        for cid, statuses in caught.items()
    }
    return Break(f"broken_impls.{module}", as_sets, world, tuple(patterns), frozenset(collateral), **options)


def _world_order(label: str) -> tuple[int, str]:
    return World.parse(label).size, label


def plan(breaks: list[Break], case_timeout: float = DEFAULT_CASE_TIMEOUT) -> list[Break]:
    """Shared-pool entries grouped by world, each group led by a reference control (cases get
    ``case_timeout``) over the union of the patterns any entry uses at that world (isolated ones
    included); then the isolated ones."""
    entries: list[Break] = []
    for world in sorted({b.world for b in breaks}, key=_world_order):
        here = [b for b in breaks if b.world == world]
        patterns = tuple(dict.fromkeys(p for b in here for p in b.patterns))
        entries.append(Break(REFERENCE, {}, world, patterns, case_timeout=case_timeout))
        entries.extend(b for b in here if not b.isolated)
    return entries + [b for b in breaks if b.isolated]


class SharedPools:
    """One `SimBackend` (or a subclass: ``sim-xla``, ``sim-npu``) over `broken_impls.switchboard`:
    pools live across entries of the same world."""

    def __init__(self, choice_file: Path, backend: type[SimBackend] = SimBackend) -> None:
        self.choice_file = choice_file
        self.backend = backend("broken_impls.switchboard", DEFAULT_CASE_TIMEOUT)
        self.backend.confirm_hang = lambda hung: False  # see CONFIRM_HANGS

    def run(self, entry: Break) -> list[CaseResult]:
        self.backend.case_timeout = entry.case_timeout
        # Read when a pool (re)starts: the reference (which brings torch and the bulk of
        # the imports) and this entry's implementation are imported then, within the start
        # timeout. A later entry's broken copy is imported in its first case, in a fraction
        # of a second; preloading them all would slow every restart of the pool (one follows
        # each case whose ranks disagree).
        preload = ",".join(dict.fromkeys([REFERENCE, entry.impl]))
        self.backend.base_env = {
            **type(self.backend).base_env,
            switchboard.CHOICE_ENV: str(self.choice_file),
            switchboard.PRELOAD_ENV: preload,
        }
        world = World.parse(entry.world)
        results = []
        for case in (c for c in select(all_cases(), entry.patterns) if c.runs_at(entry.world) and self.backend.runs(c)):
            self.choice_file.write_text(entry.impl, encoding="utf-8")
            results.append(self.backend.run_case(case, world))
        return results

    def close(self) -> None:
        self.backend.close()


def pools_fixture(backend: type[SimBackend] = SimBackend):
    """A module-scoped ``shared_pools`` fixture: one `SharedPools` over ``backend`` for a module's entries
    (conftest.py gives every module the plain CPU simulator's; a module on a mock device names its own)."""

    @pytest.fixture(scope="module")
    def shared_pools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedPools]:
        pools = SharedPools(tmp_path_factory.mktemp("switchboard") / "choice", backend=backend)
        yield pools
        pools.close()

    return shared_pools


def describe(result: CaseResult) -> str:
    message = "\n      ".join(result.message.splitlines()[:12]) or "(no message)"
    return f"{result.id} [{result.case}] at world {result.world}: {result.status.value}\n      {message}"


def summary(results: list[CaseResult]) -> str:
    return "\n".join(f"    {r.status.value:<13} {r.id} [{r.case}] world={r.world}" for r in results)


def problems_of(entry: Break, results: list[CaseResult]) -> list[str]:
    """What the suite reported wrongly about ``entry``: a break not caught, or an unrelated ID not passing."""
    problems = []
    for key, statuses in entry.caught.items():
        expected = " or ".join(sorted(s.value for s in statuses))
        found = [r for r in results if key in (r.id, r.case)]
        if not found:
            problems.append(f"{key} did not run at world {entry.world}: no case for it there, or the patterns miss it")
        problems += [
            f"{key} not caught: expected {expected}, got {describe(r)}" for r in found if r.status not in statuses
        ]
    unrelated = [
        r for r in results if r.id not in entry.collateral and not any(key in (r.id, r.case) for key in entry.caught)
    ]
    problems += [f"unrelated ID: expected PASS, got {describe(r)}" for r in unrelated if r.status is not Status.PASS]
    return problems


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def param(entry: Break):
    marks = [pytest.mark.xfail(strict=True, reason=entry.known_gap)] if entry.known_gap else []
    if entry.needs_cuda:
        marks.append(pytest.mark.skipif(not _cuda(), reason=f"{entry.impl} differs from the rule only where CUDA exists"))
    return pytest.param(entry, id=entry.label, marks=marks)




def expect_documented(entry: Break) -> None:
    """The broken module's docstring names every catalog ID that must catch it (a case name counts as its ID)."""
    if entry.impl == REFERENCE:
        return
    id_of_case = {c.name: c.id for c in all_cases()}
    unknown = [key for key in entry.caught if key not in id_of_case and key not in id_of_case.values()]
    assert not unknown, f"{entry.impl}: the entry expects IDs or cases the suite does not have: {unknown}"
    doc = importlib.import_module(entry.impl).__doc__ or ""
    missing = sorted({id_of_case.get(key, key) for key in entry.caught} - {cid for cid in id_of_case.values() if cid in doc})
    assert not missing, f"{entry.impl}: a broken module's docstring names the rule it breaks and what catches it: {missing}"


def planned_modules() -> dict[str, list[str]]:
    """Broken module -> the meta-test modules whose entries name it: every string a ``test_*.py`` here passes as
    the first argument of a call (``brk("name", ...)`` and its area variants), read from the source, not imported."""
    found: dict[str, list[str]] = {}
    for path in sorted(META_DIR.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                found.setdefault(node.args[0].value, []).append(path.name)
    return found


def judge(entry: Break, request: pytest.FixtureRequest) -> None:
    """Run ``entry`` (isolated, or on the module's ``shared_pools``) and assert the suite reported it as it should:
    its caught IDs with their statuses, every other ID PASS, and its module's docstring naming what catches it."""
    expect_documented(entry)
    # Imported here too, so that what the ranks return unpickles in the driver.
    importlib.import_module(entry.impl)
    if entry.isolated:
        options = RunOptions(
            impl=entry.impl,
            worlds=[entry.world],
            patterns=list(entry.patterns),
            case_timeout=entry.case_timeout,
            manifest=None,
            confirm_hangs=CONFIRM_HANGS,
        )
        results = execute(options, out=io.StringIO()).results
    else:
        results = request.getfixturevalue("shared_pools").run(entry)
    assert results, f"{entry.impl}: no case ran for patterns {list(entry.patterns)} at world {entry.world}"
    # Shown with ``pytest -rP``: what the suite reported for the broken rule.
    print(f"{entry.label}: " + (", ".join(
        f"{r.case}={r.status.value}" for r in results if any(key in (r.id, r.case) for key in entry.caught)
    ) or f"{len(results)} results, {sum(r.status is Status.PASS for r in results)} PASS"))
    problems = problems_of(entry, results)
    if entry.impl == REFERENCE:
        headline = "the reference must pass every case the meta-tests use, or a caught break proves nothing"
    else:
        headline = f"break {entry.impl} was not reported as it should be"
    assert not problems, (
        f"{headline} (world {entry.world}, patterns {list(entry.patterns)}):\n  - "
        + "\n  - ".join(problems)
        + f"\n\nall results:\n{summary(results)}"
    )


