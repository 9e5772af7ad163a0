"""The run itself: each module's session in turn, under one time budget shared out between the modules.

A module's share is what is left of the budget divided by the modules left, so time a module does not use
passes to the next ones. Within its share a module runs its drawn mutants in order and stops before one that
would likely overrun it (one unmutated slice's time left or less).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from . import plan, session
from .report import ModuleRun, Result

#: A mutant's run may take this many times the unmutated slice's, plus the grace, before it is a timeout.
TIMEOUT_FACTOR = 3.0
TIMEOUT_GRACE_S = 10.0
#: The longest the unmutated slice may take.
BASELINE_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Draw:
    sample: int
    seed: int
    budget_s: float


def run(slices: Sequence[plan.Slice], equivalents: Sequence[plan.Equivalent], draw: Draw, sessions: Path,
        runs: list[ModuleRun], say: Callable[[str], None] = print) -> None:
    """Run every slice's session, appending each module's :class:`ModuleRun` to ``runs`` as soon as it starts
    (so that an interrupted run still reports what ran). KeyboardInterrupt leaves the sources restored and no
    process running; it propagates."""
    backups = sessions / "pristine"
    for path in session.recover(plan.ROOT, backups):
        say(f"restored {path} from the copy an interrupted run left")
    deadline = time.monotonic() + draw.budget_s
    try:
        for index, piece in enumerate(slices):
            share_end = time.monotonic() + (deadline - time.monotonic()) / (len(slices) - index)
            _run_module(piece, equivalents, draw, sessions, share_end, runs, say)
    except KeyboardInterrupt:
        session.stop_children()
        for path in session.recover(plan.ROOT, backups):
            say(f"restored {path}")
        raise


def _run_module(piece: plan.Slice, equivalents: Sequence[plan.Equivalent], draw: Draw, sessions: Path,
                deadline: float, runs: list[ModuleRun], say: Callable[[str], None]) -> None:
    command = piece.command()
    with session.open_session(sessions / f"{piece.module}.sqlite", plan.ROOT, piece.paths) as (db, items):
        mutants = list(items)
        matched = plan.match_equivalents(mutants, equivalents, piece.paths)
        sources = {path: (plan.ROOT / path).read_text(encoding="utf-8") for path in piece.paths}
        matched.update(plan.annotation_equivalents(mutants, sources))
        drawn = plan.draw([m for m in mutants if m.key not in matched], draw.sample, draw.seed, piece.module)
        chosen = set(drawn)
        session.skip(db, [items[m] for m in mutants if m.key in matched], "equivalent")
        session.skip(db, [items[m] for m in mutants if m.key not in matched and m not in chosen], "not drawn")
        say(f"{piece.module}: {len(mutants)} mutants, {len(matched)} equivalent, {len(drawn)} drawn; "
            f"slice: {' '.join(command[1:])}")
        baseline_s = session.baseline(command, BASELINE_TIMEOUT_S)
        module_run = ModuleRun(piece, mutants, matched, drawn, baseline_s)
        runs.append(module_run)

        def record(result: Result) -> None:
            module_run.results.append(result)
            say(f"  {len(module_run.results):>3}/{len(drawn)} {result.outcome:<11} {result.seconds:6.1f} s  "
                f"{result.mutant.path}:{result.mutant.line} {result.mutant.operator}")

        with session.pristine(plan.ROOT, piece.paths, sessions / "pristine"):
            session.execute(db, [(m, items[m]) for m in drawn], command, TIMEOUT_FACTOR * baseline_s + TIMEOUT_GRACE_S,
                            deadline, baseline_s, record, plan.ROOT)
