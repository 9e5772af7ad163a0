"""Driving a run: pick cases, run them world by world, apply the manifest, summarise.

The runner prints a header naming the implementation (with its version), the
backend and the conformance level (:mod:`.levels`: the cases above it are
counted apart, "beyond level", and not run), a pytest-style progress line per world while cases run
(``.`` pass, ``F`` fail, ``E`` error, ``H`` hang, ``C`` crash, ``s`` not
supported, ``x`` expected failure), and a per-area summary at the end.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from typing import IO, Any, Callable, Sequence

from simulators.capacity import check_world
from simulators.flight_recorder import DEBUG_ENV
from simulators.topology import World

from .. import catalog
from ..packaged import packaged_toml
from . import levels
from .backends import SimBackend, make_backend
from .case import DEFAULT_CASE_TIMEOUT, LARGE_WORLDS, Case, all_cases, select
from .impl import Implementation
from .manifest import Manifest
from .native import NativeBackend
from .results import CaseResult, Status

DEFAULT_WORLDS = ("1", "2", "3", "4", "2x2")
#: Lines of each rank's output the summary shows under a result that is a problem (the JSON keeps more).
SHOWN_OUTPUT_LINES = 20
#: Named sets of worlds ``--worlds`` accepts besides labels.
WORLD_PRESETS = {"large": LARGE_WORLDS}


def parse_worlds(text: str) -> list[World]:
    """The worlds of a ``--worlds`` value ("1,2,2x2", "large"), each checked against this machine.

    Raises ValueError (a malformed or empty world) or
    :class:`simulators.capacity.CapacityError` (a world the machine cannot
    hold) with a one-line message, before any rank starts.
    """
    labels = [label.strip() for label in text.split(",") if label.strip()]
    if not labels:
        raise ValueError(f"no world in --worlds {text!r}")
    worlds = [World.parse(label) for name in labels for label in WORLD_PRESETS.get(name.lower(), (name,))]
    for world in worlds:
        check_world(world)
    return list(dict.fromkeys(worlds))


@dataclass
class RunOptions:
    impl: str
    backend: str = "sim"
    #: World labels; empty: the backend's own (DEFAULT_WORLDS on the simulator, the launch's world natively).
    worlds: Sequence[str] = ()
    patterns: Sequence[str] = ()
    case_timeout: float = DEFAULT_CASE_TIMEOUT
    manifest: Manifest | None = None
    strict: bool = False
    #: Run ranks under TORCH_DISTRIBUTED_DEBUG=DETAIL (simulated backends).
    debug_collectives: bool = False
    #: The mock accelerators' environment for every rank (``--device-count``, ``--device-memory``).
    machine: dict[str, str] = field(default_factory=dict)
    #: Whether a HANG on the simulator is confirmed by a second run, alone in fresh ranks (``SimBackend.run_case``).
    confirm_hangs: bool = True
    #: Called with the run so far when a native run ends at a hang (the process then exits): write the reports.
    on_interrupt: Callable[[Run], None] | None = None
    #: The conformance level the run holds the implementation to (:mod:`.levels`).
    level: str = levels.DEFAULT_LEVEL
    #: Leave out the cases whose outcome cannot depend on the device family (another backend's run covers them).
    skip_device_independent: bool = False


@dataclass
class Run:
    """A finished (or interrupted) run: metadata and one result per case run."""

    metadata: dict[str, Any]
    results: list[CaseResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: False on the ranks of a native run other than rank 0, which reports for all.
    reporter: bool = True

    @property
    def failed(self) -> bool:
        return any(r.status.is_problem for r in self.results)

    @property
    def unexpected_passes(self) -> list[CaseResult]:
        return [r for r in self.results if r.unexpected_pass]

    def to_json(self) -> dict[str, Any]:
        return {
            "metadata": self.metadata,
            "results": [r.to_json() for r in self.results],
            "warnings": self.warnings,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Run":
        return cls(data["metadata"], [CaseResult.from_json(r) for r in data["results"]], data.get("warnings", []))


def imported(backend: SimBackend | NativeBackend) -> dict[str, str]:
    """What the run tests: on the native backend, what rank 0 imported (after every rank agreed); on the
    simulator, the module the driver imports from the path its ranks are given."""
    if isinstance(backend, NativeBackend):
        identity = backend.identity
        return {"impl_version": identity.version, "impl_path": identity.path, "impl_read_by": "rank 0"}
    loaded = Implementation.load(backend.impl)
    return {"impl_version": loaded.version, "impl_path": getattr(loaded.module, "__file__", None) or "<no file>",
            "impl_read_by": "driver"}


def metadata(options: RunOptions, backend: SimBackend | NativeBackend, worlds: list[World]) -> dict[str, Any]:
    import torch

    return {
        "impl": options.impl,
        **imported(backend),
        "backend": options.backend,
        "level": options.level,
        "worlds": [world.label for world in worlds],
        "case_timeout_s": options.case_timeout,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "manifest": options.manifest.source if options.manifest else None,
        "debug_collectives": options.debug_collectives,
        "machine": dict(options.machine),
    }


def execute(options: RunOptions, out: IO[str] = sys.stdout) -> Run:
    """Run every selected case at every requested world it applies to (the native backend: at the launch's
    world, when ``options.worlds`` is empty). Raises NativeLaunchError where native ranks cannot run together."""
    env = {levels.LEVEL_ENV: options.level, **(DEBUG_ENV if options.debug_collectives else {})}
    if options.backend == "native":
        os.environ[levels.LEVEL_ENV] = options.level  # natively, the ranks are this process and its peers
    backend = make_backend(options.backend, options.impl, options.case_timeout, env=env, machine=options.machine)
    try:
        return _execute(options, backend, out)
    finally:
        backend.close()


def _execute(options: RunOptions, backend: SimBackend | NativeBackend, out: IO[str]) -> Run:
    reporting = not isinstance(backend, NativeBackend) or backend.is_reporter
    manifest = options.manifest
    if isinstance(backend, SimBackend) and not options.confirm_hangs:
        backend.confirm_hang = lambda hung: False
    elif isinstance(backend, SimBackend) and manifest is not None:
        # A hang the manifest lists is the implementation's known behaviour: no second run to confirm it.
        backend.confirm_hang = lambda hung: not manifest.expects(hung, Status.HANG)
    chosen = select(all_cases(), options.patterns)
    selected = [c for c in chosen if levels.within(c.level, options.level)]
    runnable = [c for c in selected if backend.runs(c)]
    skipped = set(device_independent_ids()) if options.skip_device_independent else set()
    cases = [c for c in runnable if c.id not in skipped]
    if options.worlds:
        worlds = parse_worlds(",".join(options.worlds))
    else:
        worlds = [backend.world] if isinstance(backend, NativeBackend) else parse_worlds(",".join(DEFAULT_WORLDS))
    if isinstance(backend, SimBackend):
        backend.expect(cases)
    run = Run(metadata(options, backend, worlds), reporter=reporting)
    #: IDs about another device family than the backend's: "n/a" in its column of the matrix.
    run.metadata["other_device_ids"] = sorted({c.id for c in selected} - {c.id for c in runnable})
    #: Cases above the run's level: not run, counted apart (IDs none of whose cases ran are "beyond level" in the matrix).
    run.metadata["beyond_level"] = sorted(c.key for c in chosen if c not in selected)
    #: The IDs ``-k`` chose (None: every ID): the matrix has rows for these only.
    run.metadata["selected_ids"] = sorted({c.id for c in chosen}) if options.patterns else None
    run.metadata["beyond_level_ids"] = sorted({c.id for c in chosen} - {c.id for c in selected})
    #: With ``skip_device_independent``: the IDs left to another backend's run ("device-independent" in the matrix).
    run.metadata["device_independent_ids"] = sorted({c.id for c in runnable} & skipped)
    say = out.write if reporting else (lambda text: None)
    say(_header(run.metadata, len(cases)))
    started = time.perf_counter()
    if isinstance(backend, NativeBackend):

        def interrupted() -> None:
            run.metadata["duration_s"] = round(time.perf_counter() - started, 2)
            run.metadata["interrupted"] = "a case hung: the launch ended after it"
            say("\n" + summary(run))
            out.flush()
            if options.on_interrupt is not None:
                options.on_interrupt(run)

        backend.interrupted = interrupted
    for world in worlds:
        if not backend.worlds_supported(world):
            run.warnings.append(f"backend {backend.name} cannot run world {world.label}: skipped")
            continue
        at_world = [c for c in cases if c.runs_at(world.label)]
        if not at_world:
            continue
        say(f"world {world.label:>4} ({len(at_world)} cases) ")
        out.flush()

        def emit(result: CaseResult) -> None:
            if options.manifest:
                options.manifest.apply(result)
            run.results.append(result)
            say("X" if result.unexpected_pass else result.status.symbol)
            out.flush()

        backend.run_world(world, at_world, emit)
        say("\n")
    run.metadata["duration_s"] = round(time.perf_counter() - started, 2)
    run.warnings.extend(_coverage_warnings(cases, worlds, options))
    if reporting:
        say(summary(run))
    return run


@lru_cache(maxsize=1)
def device_independent_ids() -> dict[str, str]:
    """The catalog rows whose outcome cannot depend on the device family, with why (``device_independent.toml``)."""
    return packaged_toml("device_independent.toml")["ids"]


def _header(meta: dict[str, Any], count: int) -> str:
    return (
        f"conformance: impl={meta['impl']} {meta['impl_version']}  backend={meta['backend']}  "
        f"worlds={','.join(meta['worlds'])}  torch={meta['torch']}  python={meta['python']}\n"
        f"imported: {meta['impl_path']} (read by {meta['impl_read_by']})\n"
        f"level: {meta.get('level', levels.DEFAULT_LEVEL)} ({len(meta.get('beyond_level', []))} cases beyond it, not run)\n"
        f"manifest: {meta['manifest'] or 'none'}  case timeout: {meta['case_timeout_s']} s  cases: {count}\n"
        + "".join(f"machine: {name}={value}\n" for name, value in meta.get("machine", {}).items())
        + (f"left to another backend (device-independent): {', '.join(meta['device_independent_ids'])}\n"
           if meta.get("device_independent_ids") else "")
    )


def _coverage_warnings(cases: list[Case], worlds: list[World], options: RunOptions) -> list[str]:
    """Warnings for cases that ran nowhere and manifest entries that matched nothing."""
    labels = [w.label for w in worlds]
    ran = {c.id for c in cases if any(c.runs_at(label) for label in labels)}
    idle = sorted({c.id for c in cases} - ran)
    warnings = [f"{len(idle)} case(s) run at none of this run's worlds: {', '.join(idle)}"] if idle else []
    if options.manifest:
        selected = {c.id for c in cases}
        warnings += [
            f"manifest {options.manifest.source}: deviation {d.id} matched no result"
            for d in options.manifest.unused(among=selected if options.patterns else None)
        ]
    return warnings


def summary(run: Run) -> str:
    """Per-area counts, then every result that is not a plain pass, then warnings."""
    statuses = list(Status)
    by_area: dict[str, dict[Status, int]] = {}
    for r in run.results:
        counts = by_area.setdefault(catalog.area_of(r.id), dict.fromkeys(statuses, 0))
        counts[r.status] += 1
    width = max([len(a) for a in by_area] + [4])
    lines = ["", f"{'area':<{width}}  " + " ".join(f"{s.value:>13}" for s in statuses)]
    for area, counts in by_area.items():
        lines.append(f"{area:<{width}}  " + " ".join(f"{counts[s]:>13}" for s in statuses))
    notable = [r for r in run.results if r.status != Status.PASS or r.unexpected_pass]
    if notable:
        lines.append("")
    for r in notable:
        label = "UNEXPECTED PASS" if r.unexpected_pass else r.status.value
        lines.append(f"{label} {r.id} [{r.case}] world={r.world}" + (f"  ({r.manifest_reason})" if r.manifest_reason else ""))
        if r.status.is_problem:
            lines.extend("    " + line for line in r.message.splitlines()[:40])
            for rank, text in r.output.items():
                lines.append(f"    rank {rank} output (last lines):")
                lines.extend("      " + line for line in text.splitlines()[-SHOWN_OUTPUT_LINES:])
    lines.extend(f"warning: {w}" for w in run.warnings)
    total = {s: sum(1 for r in run.results if r.status == s) for s in statuses}
    lines.append(
        "\n"
        + ", ".join([f"{n} {s.value.lower()}" for s, n in total.items() if n]
                    + [f"{n} beyond level {run.metadata.get('level')}" for n in [len(run.metadata.get("beyond_level", []))] if n])
        + f" in {run.metadata.get('duration_s', 0)} s"
    )
    return "\n".join(lines) + "\n"
