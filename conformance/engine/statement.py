"""A conformance statement: the short block a vendor publishes for one implementation at one level.

It names the implementation and its version, the level (:mod:`.levels`), the backends and worlds that ran, the
cases passed out of those run (a result the manifest expected to fail counts as run, not passed), how many cases
lay beyond the level, and each deviation of the manifest that applied, with its reason. Given as JSON
(:func:`build`), Markdown (:func:`markdown`) and a badge-style line (:func:`badge`), from one run or from several
runs of the same implementation at the same level (one per backend).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .results import Status
from .runner import Run


class StatementError(ValueError):
    """Runs that do not make one statement (another implementation, version or level): one line, exit 2."""


def build(runs: list[Run]) -> dict[str, Any]:
    """The statement of ``runs`` (StatementError when they are of different implementations, versions or levels)."""
    if not runs:
        raise StatementError("a statement needs at least one run")
    first = runs[0].metadata
    for run in runs[1:]:
        for key in ("impl", "impl_version", "level"):
            if run.metadata.get(key) != first.get(key):
                raise StatementError(f"runs differ in {key}: {first.get(key)!r} and {run.metadata.get(key)!r}; "
                                     "one statement is one implementation at one level")
    results = [result for run in runs for result in run.results]
    deviations: dict[tuple[str, str], set[str]] = {}
    for result in results:
        if result.status == Status.XFAIL:
            deviations.setdefault((result.id, result.manifest_reason), set()).add(f"{result.backend} {result.world}")
    return {
        "implementation": first["impl"],
        "version": first.get("impl_version", "unknown"),
        "level": first.get("level", "hf-1.15"),
        "backends": list(dict.fromkeys(run.metadata["backend"] for run in runs)),
        "worlds": list(dict.fromkeys(world for run in runs for world in run.metadata.get("worlds", []))),
        "passed": sum(result.status == Status.PASS for result in results),
        "run": len(results),
        "beyond_level": len({key for run in runs for key in run.metadata.get("beyond_level", [])}),
        "manifests": sorted({run.metadata["manifest"] for run in runs if run.metadata.get("manifest")}),
        "deviations": [{"id": catalog_id, "reason": reason, "where": sorted(where)}
                       for (catalog_id, reason), where in sorted(deviations.items())],
        "problems": sum(result.status.is_problem for result in results),
        "date": min(run.metadata.get("started", "") for run in runs)[:10],
    }


def badge(statement: dict[str, Any]) -> str:
    """One line: ``accelerate_ref 0.1.0 conforms to docs-0.27: 181/181 passed, 0 deviations (sim, sim-xla)``."""
    verb = "conforms to" if not statement["problems"] else "does not conform to"
    deviations = len(statement["deviations"])
    return (f"{statement['implementation']} {statement['version']} {verb} {statement['level']}: "
            f"{statement['passed']}/{statement['run']} passed, {deviations} deviation{'' if deviations == 1 else 's'} "
            f"({', '.join(statement['backends'])})")


def markdown(statement: dict[str, Any]) -> str:
    """The statement as a Markdown block."""
    lines = [
        f"## Conformance statement: {statement['implementation']} {statement['version']}",
        "",
        f"**{badge(statement)}**",
        "",
        f"- Level: `{statement['level']}` ({statement['beyond_level']} cases above it not run)",
        f"- Backends: {', '.join(statement['backends'])}; worlds: {', '.join(statement['worlds'])}",
        f"- Cases passed: {statement['passed']} of {statement['run']} run"
        + (f"; {statement['problems']} failed, errored, hung or crashed" if statement["problems"] else ""),
        f"- Manifest: {', '.join(statement['manifests']) or 'none'}",
        f"- Run on: {statement['date']}",
    ]
    if statement["deviations"]:
        lines += ["", "| Deviation | Reason | Where |", "|---|---|---|"]
        lines += [f"| `{d['id']}` | {d['reason']} | {', '.join(d['where'])} |" for d in statement["deviations"]]
    return "\n".join(lines) + "\n"


def write(runs: list[Run], path: str | Path) -> str:
    """Write the statement of ``runs`` to ``path`` (Markdown) and beside it as JSON (``.json``); its badge line."""
    statement = build(runs)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(markdown(statement), encoding="utf-8")
    target.with_suffix(".json").write_text(json.dumps(statement, indent=2) + "\n", encoding="utf-8")
    return badge(statement)
