"""The pytest plugin: ``pytest --pyargs conformance --impl accelerate``.

Registered through the ``pytest11`` entry point. It adds the suite's
options, turns every registered case into one pytest item per world it runs
at, and runs those items through the same backend and manifest as
``python -m conformance run``: NOT_SUPPORTED becomes a skip, a manifest
deviation an xfail, and FAIL/ERROR/HANG/CRASH a failure whose message is the
merged per-rank report. Only the ``sim`` backend runs under pytest.
"""

from __future__ import annotations

from typing import Any

import pytest

from simulators.topology import World

from .backends import SimBackend
from .case import Case
from .impl import Implementation, chosen
from .manifest import Manifest
from .results import CaseResult, Status
from .runner import DEFAULT_CASE_TIMEOUT, DEFAULT_WORLDS

_KEY = pytest.StashKey["_Session"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance", "accelerate conformance suite")
    group.addoption("--impl", default=None, help="implementation module under test (default: $ACCELERATE_IMPL or accelerate_ref)")
    group.addoption("--conformance-worlds", default=",".join(DEFAULT_WORLDS), help="comma-separated worlds, e.g. 1,2,2x2")
    group.addoption("--case-timeout", type=float, default=DEFAULT_CASE_TIMEOUT, help="seconds before a case is a HANG")
    group.addoption("--conformance-manifest", default=None, help="manifest of known deviations (default: the bundled one)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "conformance(id): a conformance case for catalog ID `id`")


class _Session:
    """Backend and manifest shared by every case item of a pytest session."""

    def __init__(self, config: pytest.Config) -> None:
        self.impl = chosen(config.getoption("--impl"))
        self.worlds = [w.strip() for w in config.getoption("--conformance-worlds").split(",") if w.strip()]
        path = config.getoption("--conformance-manifest")
        self.manifest = Manifest.load(path) if path else Manifest.bundled(self.impl)
        self.backend = SimBackend(self.impl, config.getoption("--case-timeout"))

    def run(self, case: Case, world: str) -> CaseResult:
        result = self.backend.run_case(case, World.parse(world))
        return self.manifest.apply(result) if self.manifest else result


def _session(config: pytest.Config) -> _Session:
    if _KEY not in config.stash:
        config.stash[_KEY] = _Session(config)
    return config.stash[_KEY]


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    if not any("conformance" in str(arg) for arg in config.invocation_params.args):
        return None
    impl = chosen(config.getoption("--impl"))
    return [f"conformance: impl={impl} {Implementation.load(impl).version}  backend=sim  worlds={config.getoption('--conformance-worlds')}"]


class CaseItem(pytest.Item):
    """One case at one world."""

    def __init__(self, *, case: Case, world: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case = case
        self.world = world
        self.add_marker(pytest.mark.conformance(case.id))

    def runtest(self) -> None:
        result = _session(self.config).run(self.case, self.world)
        if result.status == Status.PASS:
            if result.unexpected_pass:
                self.warn(pytest.PytestWarning(f"{self.case.id} passed but is listed in the manifest: {result.manifest_reason}"))
            return
        if result.status == Status.XFAIL:
            pytest.xfail(result.manifest_reason)
        if result.status == Status.NOT_SUPPORTED:
            pytest.skip(f"NOT_SUPPORTED: {result.message}")
        raise CaseFailure(result)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, CaseFailure):
            r = excinfo.value.result
            return f"{r.status.value} {r.id} at world {r.world}\n{r.message}"
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[str, int | None, str]:
        return self.path, None, f"{self.case.id} [{self.world}]"


class CaseFailure(Exception):
    def __init__(self, result: CaseResult) -> None:
        super().__init__(result.message)
        self.result = result


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector: pytest.Collector, name: str, obj: object) -> list[CaseItem] | None:
    if not isinstance(obj, Case):
        return None
    session = _session(collector.config)
    return [
        CaseItem.from_parent(collector, name=f"{obj.name}[{world}]", case=obj, world=world)
        for world in session.worlds
        if obj.runs_at(World.parse(world).label) and session.backend.runs(obj)
    ]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run case items world by world, so each world's ranks start once."""
    if not any(isinstance(item, CaseItem) for item in items):
        return
    order = {world: index for index, world in enumerate(_session(config).worlds)}
    items.sort(key=lambda item: order.get(item.world, -1) if isinstance(item, CaseItem) else -1)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _KEY in config.stash:
        config.stash[_KEY].backend.close()
