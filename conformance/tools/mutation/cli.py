"""``python -m conformance mutation``: mutants of each mapped module of ``accelerate_ref``, run against its slice.

Per module (``conformance/mutation.toml``): a fresh cosmic-ray session of every core operator's mutants, the
reviewed equivalents (``conformance/mutation_equivalent.toml``) and the mutants not drawn recorded as skipped,
the slice run once on the unmutated code (it must pass), then the drawn mutants one at a time until the module's
share of the time budget is spent. Reports: ``<reports>/mutation.json`` and ``<reports>/mutation.md`` (printed
too); cosmic-ray's sessions: ``<reports>/mutation/<module>.sqlite``.

Exit 0 when every module ran (survivors are findings, not errors), 1 when a module's slice fails unmutated or
an equivalent entry is stale, 2 on bad input or a missing cosmic-ray, 130 when interrupted (Ctrl-C or SIGTERM:
sources restored, nothing left running, what ran is reported).
"""

from __future__ import annotations

import argparse
import importlib.util
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from . import plan

DEFAULT_SAMPLE = 60
DEFAULT_BUDGET_S = 3300.0


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("mutation", help="mutation testing of accelerate_ref against the suite (cosmic-ray)")
    parser.add_argument("--module", dest="modules", action="append", default=[],
                        help="only this module of conformance/mutation.toml (its full name or last part, e.g. hooks)")
    parser.add_argument("--sample", type=int, default=DEFAULT_SAMPLE,
                        help=f"mutants drawn per module (default {DEFAULT_SAMPLE})")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S,
                        help=f"seconds for the whole run, shared out between the modules (default {DEFAULT_BUDGET_S:.0f})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the draw (default 0)")
    parser.add_argument("--reports", default="reports", metavar="DIR",
                        help="where mutation.json, mutation.md and the sessions (mutation/) go (default reports)")


def _fail(message: str, status: int) -> int:
    print(f"conformance mutation: {message}", file=sys.stderr)
    return status


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def checkout_problem(root: Path = plan.ROOT) -> str | None:
    """Why mutating the files under ``root`` would not reach the runs (``accelerate_ref`` imports from
    elsewhere), or None."""
    spec = importlib.util.find_spec("accelerate_ref")
    origin = Path(spec.origin).resolve() if spec and spec.origin else None
    if origin is None or origin.parent.parent != root:
        return f"accelerate_ref imports from {origin}, not from {root}: put the checkout first on PYTHONPATH"
    return None


def command(args: argparse.Namespace) -> int:
    if args.sample < 1 or args.budget <= 0:
        return _fail("--sample and --budget must be positive", 2)
    try:
        slices = plan.select(plan.load_map(), args.modules)
        equivalents = plan.load_equivalents()
    except plan.PlanError as error:
        return _fail(str(error), 2)
    if problem := checkout_problem():
        return _fail(problem, 2)
    try:
        from . import driver, session
    except ImportError as error:
        return _fail(f"{error.name or error} is missing: pip install -e '.[mutation]' (or run make mutation)", 2)
    from .report import write

    reports = Path(args.reports)
    runs: list = []
    interrupted = False
    started = time.monotonic()
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        driver.run(slices, equivalents, driver.Draw(args.sample, args.seed, args.budget), reports / "mutation", runs,
                   say=lambda text: print(text, flush=True))
    except KeyboardInterrupt:
        interrupted = True
    except (session.SessionError, plan.PlanError) as error:
        return _fail(str(error), 1)
    meta = {"seed": args.seed, "sample": args.sample, "budget_s": args.budget,
            "duration_s": round(time.monotonic() - started, 1), "interrupted": interrupted}
    print(write(runs, meta, reports / "mutation.json", reports / "mutation.md"))
    if interrupted:
        return _fail("interrupted: sources restored, no process left running; what ran is reported", 130)
    return 0
