"""What a mutation run found, per module: counts, kill rate, and every surviving mutant with its diff.

The kill rate is over the mutants that ran and are not equivalent: (killed + timed out) / (killed + timed out +
survived). A mutant cosmic-ray could not run (``incompetent``) counts in none of them; a drawn mutant the time
budget did not reach is ``not run``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .plan import Equivalent, Mutant, Slice

OUTCOMES = ("killed", "survived", "timeout", "incompetent")


@dataclass(frozen=True)
class Result:
    """What became of one drawn mutant: ``killed``, ``survived``, ``timeout`` or ``incompetent`` (cosmic-ray could
    not apply it or run the slice), with the seconds its run took and cosmic-ray's diff."""

    mutant: Mutant
    outcome: str
    seconds: float
    diff: str


@dataclass
class ModuleRun:
    """Everything one module's session produced."""

    slice: Slice
    mutants: list[Mutant]
    equivalents: dict[tuple[str, str, int], Equivalent]
    drawn: list[Mutant]
    baseline_s: float
    results: list[Result] = field(default_factory=list)


@dataclass(frozen=True)
class Counts:
    module: str
    total: int
    sampled: int
    killed: int
    survived: int
    timeout: int
    incompetent: int
    equivalent: int
    not_run: int
    kill_rate: float | None
    seconds_per_mutant: float | None
    baseline_s: float

    @classmethod
    def of(cls, run: ModuleRun) -> "Counts":
        by_outcome = {outcome: sum(1 for r in run.results if r.outcome == outcome) for outcome in OUTCOMES}
        detected = by_outcome["killed"] + by_outcome["timeout"]
        judged = detected + by_outcome["survived"]
        return cls(
            module=run.slice.module,
            total=len(run.mutants),
            sampled=len(run.drawn),
            equivalent=len(run.equivalents),
            not_run=len(run.drawn) - len(run.results),
            kill_rate=round(detected / judged, 4) if judged else None,
            seconds_per_mutant=round(sum(r.seconds for r in run.results) / len(run.results), 2) if run.results else None,
            baseline_s=round(run.baseline_s, 2),
            **by_outcome,
        )


def _percent(rate: float | None) -> str:
    return "n/a" if rate is None else f"{rate:.0%}"


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def table(runs: Sequence[ModuleRun]) -> str:
    """The per-module counts as a Markdown table, with a total row over all modules."""
    head = ["module", "mutants", "sampled", "killed", "survived", "timed out", "incompetent", "equivalent",
            "not run", "kill rate", "s/mutant"]
    rows = [Counts.of(run) for run in runs]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in rows:
        lines.append(f"| {c.module} | {c.total} | {c.sampled} | {c.killed} | {c.survived} | {c.timeout} | "
                     f"{c.incompetent} | {c.equivalent} | {c.not_run} | {_percent(c.kill_rate)} | "
                     f"{_seconds(c.seconds_per_mutant)} |")
    total = totals(runs)
    lines.append(f"| **all** | {total['total']} | {total['sampled']} | {total['killed']} | {total['survived']} | "
                 f"{total['timeout']} | {total['incompetent']} | {total['equivalent']} | {total['not_run']} | "
                 f"{_percent(total['kill_rate'])} | {_seconds(total['seconds_per_mutant'])} |")
    return "\n".join(lines)


def totals(runs: Sequence[ModuleRun]) -> dict[str, Any]:
    """The counts summed over ``runs``; the kill rate and seconds per mutant over all their mutants that ran."""
    rows = [Counts.of(run) for run in runs]
    summed = {name: sum(getattr(c, name) for c in rows)
              for name in ("total", "sampled", "killed", "survived", "timeout", "incompetent", "equivalent", "not_run")}
    detected = summed["killed"] + summed["timeout"]
    judged = detected + summed["survived"]
    ran = [r.seconds for run in runs for r in run.results]
    summed["kill_rate"] = round(detected / judged, 4) if judged else None
    summed["seconds_per_mutant"] = round(sum(ran) / len(ran), 2) if ran else None
    return summed


def survivors(runs: Sequence[ModuleRun]) -> list[Result]:
    return [result for run in runs for result in run.results if result.outcome == "survived"]


def markdown(runs: Sequence[ModuleRun], meta: dict[str, Any]) -> str:
    """The table, how the run was drawn, and each surviving mutant at ``file:line`` with its diff."""
    lines = ["# Mutation testing of accelerate_ref", "",
             f"seed {meta['seed']}, up to {meta['sample']} mutants a module, budget {meta['budget_s']} s, "
             f"took {meta['duration_s']} s{' (interrupted)' if meta.get('interrupted') else ''}", "",
             table(runs), ""]
    found = survivors(runs)
    lines.append(f"## Surviving mutants ({len(found)})")
    for result in found:
        mutant = result.mutant
        lines += ["", f"### {mutant.path}:{mutant.line} {mutant.operator} #{mutant.occurrence}", "",
                  "```diff", result.diff.replace("--- mutation diff ---\n", "").strip(), "```"]
    return "\n".join(lines) + "\n"


def to_json(runs: Sequence[ModuleRun], meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "meta": meta,
        "totals": totals(runs),
        "modules": [
            {
                **asdict(Counts.of(run)),
                "paths": list(run.slice.paths),
                "command": run.slice.command("python"),
                "results": [{**asdict(r.mutant), "outcome": r.outcome, "seconds": r.seconds,
                             **({"diff": r.diff} if r.outcome == "survived" else {})} for r in run.results],
                "not_run_mutants": [asdict(m) for m in run.drawn[len(run.results):]],
                "equivalent_mutants": [asdict(e) for e in run.equivalents.values()],
            }
            for run in runs
        ],
    }


def write(runs: Sequence[ModuleRun], meta: dict[str, Any], json_path: Path, markdown_path: Path) -> str:
    """Write both reports; return the Markdown."""
    text = markdown(runs, meta)
    for path in (json_path, markdown_path):
        path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(to_json(runs, meta), indent=1) + "\n", encoding="utf-8")
    markdown_path.write_text(text, encoding="utf-8")
    return text
