"""``python -m conformance differential``: every probe under ``--impl`` and ``--against``, compared.

Exit 0 when no difference is unexplained and no deviation is stale, 1
otherwise, 2 on bad input (an implementation that does not import, an
unreadable deviation file, an unknown setting, a pattern that selects no probe).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from pathlib import Path

from ...engine.impl import chosen
from . import deviations as deviation_file
from .probe import all_probes
from .runner import SETTINGS, run


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("differential", help="probe public behaviours under two implementations, compare")
    parser.add_argument("--impl", help="implementation under test (default: $ACCELERATE_IMPL or accelerate_ref)")
    parser.add_argument("--against", default="accelerate", help="the reference implementation (default: accelerate)")
    parser.add_argument("-k", dest="patterns", action="append", default=[],
                        help="only probes whose name matches (fnmatch; a plain word matches as a substring)")
    parser.add_argument("--settings", default=",".join(SETTINGS),
                        help=f"comma-separated family/world settings (default: {','.join(SETTINGS)})")
    parser.add_argument("--deviations", metavar="PATH", help="deviation file (default: <impl>/DIFFERENTIAL.toml)")
    parser.add_argument("--coverage", action="store_true",
                        help="report the public functions and methods no probe reaches (slower)")
    parser.add_argument("--json", metavar="PATH", help="write the findings as JSON")
    parser.add_argument("-v", "--verbose", action="store_true", help="list explained differences too")
    parser.set_defaults(handler=command)


def _selected(patterns: list[str]) -> list:
    probes = all_probes()
    if not patterns:
        return probes
    globs = [pattern if any(c in pattern for c in "*?[") else f"*{pattern}*" for pattern in patterns]
    return [found for found in probes if any(fnmatch.fnmatchcase(found.name, glob) for glob in globs)]


def command(args: argparse.Namespace) -> int:
    impl = chosen(args.impl)
    settings = [setting.strip() for setting in args.settings.split(",") if setting.strip()]
    unknown = [setting for setting in settings if setting not in SETTINGS]
    if unknown:
        print(f"conformance differential: unknown setting {unknown[0]!r}; choose from {', '.join(SETTINGS)}",
              file=sys.stderr)
        return 2
    probes = _selected(args.patterns)
    if not probes:
        print("conformance differential: no probe matches -k " + " ".join(args.patterns), file=sys.stderr)
        return 2
    try:
        entries = deviation_file.load(args.deviations or deviation_file.bundled(impl))
        print(f"differential: candidate {impl}, reference {args.against}, {len(probes)} probes", flush=True)
        report = run(impl, args.against, probes, entries, settings, args.coverage,
                     progress=lambda text: print(text, end="", flush=True))
    except (ImportError, deviation_file.DeviationFileError) as error:
        print(f"conformance differential: {str(error).splitlines()[0]}", file=sys.stderr)
        return 2
    print(report.text(args.verbose))
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(), indent=1, default=str), encoding="utf-8")
    return 0 if report.ok else 1
