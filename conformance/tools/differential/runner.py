"""Run every probe under both implementations, wherever it runs, and compare what they saw.

Rules:

* ``cpu/1`` probes run in this process, reference then candidate per probe,
  each stopped at its timeout with its stack as the observation;
* every other setting (``cpu/2``; ``cuda/1``, ``cuda/2`` on the simulator's
  mock CUDA GPUs) runs in a rank pool of that world, one pool per setting,
  one pool call per probe (:mod:`.rank`), with the probe's timeout; a probe
  whose ranks hang or crash is one finding with the ranks' account, and the
  pool is started again for the next probe;
* two runs agree when every rank recorded the same labels with equal
  observations; each label that differs (or that only one side recorded) is
  a :class:`Finding`, explained when a deviation entry matches it.
"""

from __future__ import annotations

import contextlib
import gc
import json
import shutil
import signal
import sys
import tempfile
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from simulators.devices import world_settings
from simulators.pool import PoolStartError, RankPool
from simulators.topology import World

from ...engine.backends import RANK_PRELOAD
from . import rank
from .coverage import CodeKey, Coverage, Recorder, report
from .deviations import Deviation
from .observe import ClassIndex, ProbeTimeout
from .probe import PROBE_CODE_RAISED, Observations, Probe, Subject, run_probe

IN_PROCESS = "cpu/1"
SETTINGS = ("cpu/1", "cpu/2", "cpu/3", "cuda/1", "cuda/2")
#: HF accelerate needs ``ACCELERATE_USE_CPU`` to see MULTI_CPU under a torchrun-style launch on CPU ranks.
_CPU_ENV = {"ACCELERATE_USE_CPU": "1"}


@dataclass
class Finding:
    """One recorded call whose observation differs between the implementations (None: not recorded)."""

    probe: str
    setting: str
    rank: int
    label: str
    reference: Any
    candidate: Any
    #: the deviation entry that explains it, if any
    deviation: Deviation | None = None

    @property
    def reason(self) -> str | None:
        return self.deviation.reason if self.deviation else None

    def text(self) -> str:
        head = f"{self.probe} [{self.setting} rank {self.rank}] {self.label}"
        if self.reason:
            return f"{head}: explained: {self.reason}"
        return (f"{head}\n    reference: {json.dumps(self.reference, default=str)}"
                f"\n    candidate: {json.dumps(self.candidate, default=str)}")


@dataclass
class Report:
    """What a run found: probes run per setting, findings, stale deviations, coverage if measured."""

    candidate: str
    reference: str
    runs: dict[str, int] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    stale: list[Deviation] = field(default_factory=list)
    coverage: Coverage | None = None

    @property
    def unexplained(self) -> list[Finding]:
        return [finding for finding in self.findings if finding.reason is None]

    @property
    def ok(self) -> bool:
        return not self.unexplained and not self.stale

    def text(self, verbose: bool = False) -> str:
        lines = [f"== differential: {self.candidate} against {self.reference}: "
                 f"{sum(self.runs.values())} probe runs ({', '.join(f'{k}: {v}' for k, v in self.runs.items())}) =="]
        shown = self.findings if verbose else self.unexplained
        lines.extend(finding.text() for finding in shown)
        lines.extend(f"stale deviation: {entry.probe} {entry.label or ''} [{entry.setting or 'all settings'}]: "
                     "the behaviours agree now (or the probe is gone)" for entry in self.stale)
        explained = len(self.findings) - len(self.unexplained)
        lines.append(f"{len(self.unexplained)} unexplained difference(s), {explained} explained by deviations, "
                     f"{len(self.stale)} stale deviation(s)")
        if self.coverage is not None:
            lines.append(self.coverage.text())
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"candidate": self.candidate, "reference": self.reference, "runs": self.runs,
                "findings": [asdict(finding) for finding in self.findings],
                "stale": [asdict(entry) for entry in self.stale]}


def compare(reference: Observations, candidate: Observations) -> list[tuple[str, Any, Any]]:
    """``(label, reference, candidate)`` for each label whose observations differ, in recorded order."""
    ours, theirs = dict(candidate), dict(reference)
    labels = [label for label, _ in reference] + [label for label, _ in candidate if label not in theirs]
    return [(label, theirs.get(label), ours.get(label)) for label in labels if theirs.get(label) != ours.get(label)]


Progress = Callable[[str], None]


def run(candidate: str, reference: str, probes: Iterable[Probe], deviations: list[Deviation],
        settings: Iterable[str] = SETTINGS, measure_coverage: bool = False, progress: Progress | None = None) -> Report:
    """Run ``probes`` under both implementations at each of ``settings`` where they apply; see the rules."""
    say = progress or (lambda text: None)
    result = Report(candidate, reference)
    calls: set[CodeKey] = set()
    planned = list(probes)
    ran: list[tuple[str, str]] = []
    for setting in settings:
        chosen = [found for found in planned if setting in found.settings()]
        if not chosen:
            continue
        say(f"{setting}: {len(chosen)} probes ")
        runner = _in_process if setting == IN_PROCESS else _on_ranks
        for found, per_rank in runner(candidate, reference, setting, chosen, measure_coverage, calls):
            ran.append((found.name, setting))
            findings = _findings(found.name, setting, per_rank, deviations)
            result.findings.extend(findings)
            say("." if not findings else ("d" if all(f.reason for f in findings) else "D"))
        result.runs[setting] = len(chosen)
        say("\n")
    used = {id(finding.deviation) for finding in result.findings if finding.deviation}
    result.stale = [entry for entry in deviations
                    if id(entry) not in used and any(entry.applies_to(name, setting) for name, setting in ran)]
    if measure_coverage:
        result.coverage = report(calls)
    return result


def _match(deviations: list[Deviation], probe: str, label: str, setting: str) -> Deviation | None:
    return next((entry for entry in deviations if entry.matches(probe, label, setting)), None)


def _findings(name: str, setting: str, per_rank: dict[int, dict[str, Any]], deviations: list[Deviation]) -> list[Finding]:
    """The differences of each rank's replies, and (never explained) a probe that fails under the reference itself:
    its own code raised, or it ran past its timeout."""
    findings = []
    for rank_index, reply in sorted(per_rank.items()):
        reference = dict(reply["reference"])
        failed = (reference.get(PROBE_CODE_RAISED) or {}).get("value") or (reference.get("probe") or {}).get("timeout")
        if failed:
            findings.append(Finding(name, setting, rank_index, "the probe itself, under the reference", failed, None))
        for label, theirs, ours in compare(reply["reference"], reply["candidate"]):
            entry = _match(deviations, name, label, setting)
            findings.append(Finding(name, setting, rank_index, label, theirs, ours, entry))
    return findings


def _in_process(candidate: str, reference: str, setting: str, probes: list[Probe], measure_coverage: bool,
                calls: set[CodeKey]):
    classes = ClassIndex.of_public_api()
    subjects = {"reference": Subject(reference, reference, classes), "candidate": Subject(candidate, reference, classes)}
    rank.deepspeed_accelerator_quietly()
    with frozen_heap():
        for found in probes:
            reply: dict[str, Observations] = {}
            for role, subject in subjects.items():
                with Recorder(subject.impl.module if measure_coverage and role == "reference" else None) as recorder:
                    reply[role] = _within(found.timeout, run_probe, found, subject)
                calls.update(recorder.calls)
            gc.freeze()  # what the probe imported and kept joins the frozen heap: later collections skip it too
            yield found, {0: reply}


@contextlib.contextmanager
def frozen_heap():
    """Keep what is loaded so far (torch, both implementations, the probes) out of the garbage collector's scans.

    Both implementations call ``gc.collect()`` (``release_memory``,
    ``find_executable_batch_size``, checkpoint loading); with two
    implementations and every probe module loaded each collection took a
    quarter of a second, most of a probe's time. Objects made inside are
    collected as usual; what a probe leaves behind (the modules it imported) is frozen after it
    (:func:`_in_process`); the heap is unfrozen after.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _within(seconds: float, function: Callable[..., Observations], *args: Any) -> Observations:
    """``function(*args)``, or the probe's stack as its one observation once ``seconds`` pass (SIGALRM)."""
    def expire(signum: int, frame: Any) -> None:
        raise ProbeTimeout(f"past {seconds:g} s in:\n" + "".join(traceback.format_stack(frame)[-6:]))

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return function(*args)
    except ProbeTimeout as error:
        return [("probe", {"timeout": str(error)})]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _on_ranks(candidate: str, reference: str, setting: str, probes: list[Probe], measure_coverage: bool,
              calls: set[CodeKey]):
    family, _, size = setting.partition("/")
    devices = world_settings(family) if family != "cpu" else None
    pool = RankPool(
        World.of(int(size)),
        setup="conformance.tools.differential.rank:setup",
        env={**(devices.env if devices else _CPU_ENV), rank.REFERENCE_ENV: reference, rank.CANDIDATE_ENV: candidate},
        pythonpath=[*(devices.pythonpath if devices else ()), *sys.path],
        preload=[*RANK_PRELOAD, "conformance.tools.differential.rank", reference, candidate,
                 "conformance.tools.differential.fork_server"],
    )
    scratch = Path(tempfile.mkdtemp(prefix="differential-"))
    try:
        for found in probes:
            shared = scratch / found.name
            try:
                outcome = pool.run("conformance.tools.differential.rank:run_one", (found.name, family, str(shared), measure_coverage),
                                   found.timeout)
            except PoolStartError as error:
                yield found, _failed(f"the ranks did not start: {error}")
                continue
            finally:
                shutil.rmtree(shared, ignore_errors=True)
            if outcome.status != "ok":
                yield found, _failed(f"{outcome.status}: " + _account(outcome))
                continue
            replies = {}
            for rank_index, rank_outcome in outcome.outcomes.items():
                if rank_outcome.error is not None:
                    replies[rank_index] = _failed(f"rank {rank_index}: {rank_outcome.error}")[0]
                    continue
                replies[rank_index] = rank_outcome.value
                calls.update(rank_outcome.value.pop("calls", ()))
            yield found, replies
    finally:
        pool.close()
        shutil.rmtree(scratch, ignore_errors=True)


def _failed(account: str) -> dict[int, dict[str, Observations]]:
    """A probe whose ranks did not all answer: one finding holding the account, against an empty reference."""
    return {0: {"reference": [], "candidate": [("ranks", {"failed": account})]}}


def _account(outcome: Any) -> str:
    parts = [f"rank {r} exit {code}" for r, code in sorted(outcome.exit_codes.items())]
    parts += [f"rank {r} stack:\n{stack}" for r, stack in sorted(outcome.stacks.items())]
    parts += [f"rank {r} output:\n{tail[-2000:]}" for r, tail in sorted(outcome.output_tail.items()) if tail.strip()]
    return "\n".join(parts)
