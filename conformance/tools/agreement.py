"""The agreement check: the native path and the simulator give an implementation the same verdicts.

For an implementation and a world W, every case's status at W natively (torchrun on this host,
:mod:`conformance.tools.torchrun`) must equal its status at W on the ``sim`` backend, both without a manifest, except
the cases listed in ``conformance/agreement.toml`` with their reason (a case that needs the simulator's mock devices,
or whose outcome depends on the machine). A case that hangs natively ends its launch; the cases after it run in
the next launch. Cases the simulator does not run (about another device family: ``sim`` runs
them only on their family's mock) are counted apart, not compared.

``python -m conformance agree --impl accelerate --worlds 1,2,2x2 [-k PATTERN]`` prints one line per world (compared,
agreeing, listed, native only) and every disagreement; exit 1 on an unlisted disagreement.
"""

from __future__ import annotations

import io
import sys
from dataclasses import dataclass, field
from typing import IO, Any, Sequence

from simulators.topology import World

from ..engine.case import all_cases, select
from ..packaged import packaged_toml
from ..engine.results import CaseResult
from ..engine.runner import RunOptions, execute
from .torchrun import run_native

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


@dataclass(frozen=True)
class Listed:
    """A case whose native status may differ from the simulator's, and why."""

    #: A catalog ID or a case's function name.
    key: str
    reason: str
    #: World labels it applies at (all when empty).
    worlds: tuple[str, ...] = ()

    def matches(self, result: CaseResult) -> bool:
        return self.key in (result.id, result.case) and (not self.worlds or result.world in self.worlds)


def listed(path: str | None = None) -> list[Listed]:
    """The listed exceptions: ``path``, else the bundled ``conformance/agreement.toml``."""
    if path:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    else:
        data = packaged_toml("agreement.toml")
    return [Listed(entry["case"], entry["reason"], tuple(entry.get("worlds", ()))) for entry in data.get("exception", [])]


@dataclass
class Agreement:
    """The comparison of one implementation's native and simulated run at one world."""

    impl: str
    world: str
    agreeing: list[str] = field(default_factory=list)
    #: Cases whose statuses differ and that no exception lists: "id [case]: native X, sim Y".
    disagreeing: list[str] = field(default_factory=list)
    #: Listed cases that ran on both, whatever their statuses: "id [case]: native X, sim Y (reason)".
    excused: list[str] = field(default_factory=list)
    #: Cases only the native run has (another device family's), by "id [case]".
    native_only: list[str] = field(default_factory=list)
    #: Cases only the simulated run has: a case the native backend skipped is a fault of the native path.
    sim_only: list[str] = field(default_factory=list)
    #: The native run's results, as rank 0 reported them.
    native: list[CaseResult] = field(default_factory=list)

    @property
    def compared(self) -> int:
        return len(self.agreeing) + len(self.disagreeing) + len(self.excused)

    @property
    def ok(self) -> bool:
        return not self.disagreeing and not self.sim_only

    def line(self) -> str:
        return (f"{self.impl} at world {self.world}: {self.compared} compared, {len(self.agreeing)} agree, "
                f"{len(self.excused)} listed, {len(self.disagreeing)} disagree, {len(self.native_only)} native only"
                + (f", {len(self.sim_only)} missing natively" if self.sim_only else ""))

    def text(self) -> str:
        return "\n".join([self.line(), *(f"  disagree: {d}" for d in self.disagreeing),
                          *(f"  missing natively: {d}" for d in self.sim_only)])


def _label(result: CaseResult) -> str:
    return f"{result.id} [{result.case}]"


def compare(impl: str, world: str, native: list[CaseResult], simulated: list[CaseResult],
            exceptions: Sequence[Listed]) -> Agreement:
    """Case by case, the native status against the simulated one (results matched by ID and case name)."""
    agreement = Agreement(impl, world, native=list(native))
    by_key = {(r.id, r.case): r for r in simulated}
    native_keys = {(r.id, r.case) for r in native}
    for result in native:
        other = by_key.get((result.id, result.case))
        if other is None:
            agreement.native_only.append(_label(result))
            continue
        statuses = f"native {result.status.value}, sim {other.status.value}"
        reason = next((e.reason for e in exceptions if e.matches(result)), None)
        if reason is not None:
            agreement.excused.append(f"{_label(result)}: {statuses} ({reason})")
        elif result.status == other.status:
            agreement.agreeing.append(_label(result))
        else:
            message = (result.message or other.message).strip().splitlines()
            agreement.disagreeing.append(f"{_label(result)}: {statuses}" + (f" - {message[0]}" if message else ""))
    agreement.sim_only = [_label(r) for r in simulated if (r.id, r.case) not in native_keys]
    return agreement


def native_results(impl: str, world: World, patterns: Sequence[str], **options: Any) -> list[CaseResult]:
    """Every selected case's native result at ``world``. A hang ends a launch (its ranks are out of step): the
    cases after it run in a new launch, until every case has a result."""
    remaining = [c for c in select(all_cases(), patterns) if c.runs_at(world.label)]
    results: list[CaseResult] = []
    while remaining:
        run = run_native(impl, world, sorted({c.name for c in remaining}), **options).run
        results += run.results
        if not run.metadata.get("interrupted"):
            break
        done = {(r.id, r.case) for r in results}
        remaining = [c for c in remaining if (c.id, c.name) not in done]
    return results


def check(impl: str, world: World, patterns: Sequence[str] = (), *, exceptions: Sequence[Listed] | None = None,
          case_timeout: float | None = None, pythonpath: Sequence[str] = ()) -> Agreement:
    """Run ``impl``'s cases matching ``patterns`` at ``world`` natively and on the simulator; compare them."""
    native = native_results(impl, world, patterns, case_timeout=case_timeout, pythonpath=pythonpath)
    options = RunOptions(impl=impl, worlds=[world.label], patterns=list(patterns), manifest=None,
                         **({"case_timeout": case_timeout} if case_timeout else {}))
    simulated = execute(options, out=io.StringIO())
    return compare(impl, world.label, native, simulated.results,
                   listed() if exceptions is None else exceptions)


def main(impl: str, worlds: Sequence[World], patterns: Sequence[str], exceptions_path: str | None = None,
         out: IO[str] = sys.stdout) -> int:
    """The ``agree`` command: 0 when every world agrees but for listed cases, 1 otherwise."""
    exceptions = listed(exceptions_path)
    ok = True
    for world in worlds:
        agreement = check(impl, world, patterns, exceptions=exceptions)
        out.write(agreement.text() + "\n")
        out.flush()
        ok = ok and agreement.ok
    return 0 if ok else 1
