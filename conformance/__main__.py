"""Command line: ``python -m conformance run|list|report|parity|differential|shipped|mutation``.

* ``run``: run the suite against ``--impl`` (or ``ACCELERATE_IMPL``) on a backend.
* ``list``: one line per catalog ID with the cases that cover it, or ``UNCOVERED``.
* ``report``: build the Markdown/HTML matrix from saved JSON runs.
* ``parity``: every public name of HF accelerate's documented modules, checked in ``--impl``.
* ``differential``: probes of public behaviour under ``--impl`` and ``--against``, compared (:mod:`conformance.tools.differential`).
* ``shipped``: HF's own self-test scripts from its wheel, on HF and switched to ``--impl`` (:mod:`conformance.tools.shipped`).
* ``agree``: the native path (torchrun on this host) against the simulator, case by case (:mod:`conformance.tools.agreement`).
* ``mutation``: mutation testing of ``accelerate_ref`` against slices of the suite, with cosmic-ray (:mod:`conformance.tools.mutation`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from . import catalog
from .engine import levels, report, statement
from simulators.devices.families.machine import machine_env

from .engine.backends import BACKENDS, mock_device
from .engine.case import all_cases
from .engine.impl import chosen
from .engine.manifest import Manifest
from .engine.native import NativeLaunchError, say
from simulators.cli import OneLineParser

from .tools.differential import cli as differential_cli
from .tools.mutation import cli as mutation_cli
from .tools.shipped import DEFAULT_SCRIPT_TIMEOUT
from .engine.runner import DEFAULT_CASE_TIMEOUT, DEFAULT_WORLDS, WORLD_PRESETS, RunOptions, execute, parse_worlds


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="conformance", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run the suite")
    run.add_argument("--impl", help="implementation module (default: $ACCELERATE_IMPL or accelerate_ref)")
    run.add_argument("--backend", default="sim", choices=BACKENDS)
    run.add_argument("--worlds", help=f"comma-separated worlds, e.g. 1,2,4,2x2, or a preset: {', '.join(WORLD_PRESETS)} "
                     f"(default: {','.join(DEFAULT_WORLDS)}; native: the launch's world)")
    run.add_argument("-k", dest="patterns", action="append", default=[], help="only cases whose ID or name matches")
    run.add_argument("--level", choices=levels.LEVELS, default=os.environ.get(levels.LEVEL_ENV) or levels.DEFAULT_LEVEL,
                     help="what to hold the implementation to: the v0.27 documents, the v1.x documents, or HF 1.15's "
                          f"behaviour where they are silent (default: ${levels.LEVEL_ENV} or {levels.DEFAULT_LEVEL}); "
                          "cases above it are counted apart and not run")
    run.add_argument("--skip-device-independent", action="store_true",
                     help="leave out the cases whose outcome cannot depend on the device family (listed in "
                          "conformance/device_independent.toml): another backend's run covers them")
    run.add_argument("--case-timeout", type=float, default=DEFAULT_CASE_TIMEOUT, help="seconds before a case is a HANG")
    run.add_argument("--manifest", help="a manifest of known deviations (default: the bundled one for --impl)")
    run.add_argument("--no-manifest", action="store_true", help="ignore the bundled manifest")
    run.add_argument("--debug-collectives", action="store_true",
                     help="run ranks under TORCH_DISTRIBUTED_DEBUG=DETAIL: mismatched collectives fail at once")
    run.add_argument("--strict", action="store_true", help="fail on an unexpected pass of a manifest entry")
    run.add_argument("--device-count", help="mock accelerators every rank sees (sim-npu, sim-xla; default one per rank)")
    run.add_argument("--device-memory", help="memory budget of each mock accelerator: bytes, 64MB, 500MiB (default none)")
    for fmt in ("json", "junit", "markdown", "html"):
        run.add_argument(f"--{fmt}", metavar="PATH", help=f"write a {fmt} report")
    run.add_argument("--statement", metavar="PATH.md", help="write the run's conformance statement: Markdown here, "
                     "JSON beside it; prints its badge line")

    commands.add_parser("list", help="catalog IDs and the cases that cover them")

    rep = commands.add_parser("report", help="matrix from saved JSON runs")
    rep.add_argument("runs", nargs="+", metavar="RUN.json")
    rep.add_argument("--markdown", metavar="PATH")
    rep.add_argument("--html", metavar="PATH")
    rep.add_argument("--statement", metavar="PATH.md", help="write the conformance statement of the runs (one "
                     "implementation at one level): Markdown here, JSON beside it; prints its badge line")

    par = commands.add_parser("parity", help="public names of accelerate, present and compatible in --impl")
    par.add_argument("--impl", help="implementation package (default: $ACCELERATE_IMPL or accelerate_ref)")
    par.add_argument("--exclusions", metavar="PATH", help="names left out on purpose (default: <impl>/PARITY.toml)")
    par.add_argument("--module", dest="modules", action="append", default=[], help="only this accelerate module")
    par.add_argument("--markdown", metavar="PATH", help="write the per-module counts as a Markdown table")
    par.add_argument("-v", "--verbose", action="store_true", help="list every gap, explained or not")

    shipped = commands.add_parser("shipped", help="HF's shipped self-test scripts on HF and switched to --impl")
    shipped.add_argument("--impl", help="implementation package (default: $ACCELERATE_IMPL or accelerate_ref)")
    shipped.add_argument("-k", dest="patterns", action="append", default=[], help="only scripts whose path contains this")
    shipped.add_argument("--script-timeout", type=float, default=DEFAULT_SCRIPT_TIMEOUT,
                         help="seconds before a script is a hang on one implementation")
    shipped.add_argument("--logs", metavar="DIR", help="keep every run's rank output here")
    shipped.add_argument("--markdown", metavar="PATH", help="write the table here too")

    agree = commands.add_parser("agree", help="native (torchrun on this host) and simulated statuses, case by case")
    agree.add_argument("--impl", help="implementation module (default: $ACCELERATE_IMPL or accelerate_ref)")
    agree.add_argument("--worlds", default="1,2,2x2", help="comma-separated worlds (default 1,2,2x2)")
    agree.add_argument("-k", dest="patterns", action="append", default=[], help="only cases whose ID or name matches")
    agree.add_argument("--exceptions", metavar="PATH", help="listed cases and reasons (default: the bundled agreement.toml)")

    differential_cli.add_parser(commands)
    mutation_cli.add_parser(commands)
    return parser


def _manifest(args: argparse.Namespace, impl: str) -> Manifest | None:
    if args.manifest:
        return Manifest.load(args.manifest)
    return None if args.no_manifest else Manifest.bundled(impl)


def _machine(args: argparse.Namespace) -> dict[str, str]:
    """The ranks' mock accelerator environment; ValueError when the backend has none or a value is bad."""
    if args.device_count is None and args.device_memory is None:
        return {}
    kind = mock_device(args.backend)
    if kind is None:
        raise ValueError(f"backend {args.backend} has no mock accelerators; --device-count and --device-memory "
                         "need sim-npu or sim-xla")
    return machine_env(kind, args.device_count, args.device_memory)


def cmd_run(args: argparse.Namespace) -> int:
    try:
        worlds = [world.label for world in parse_worlds(args.worlds)] if args.worlds else []
    except ValueError as error:
        print(f"conformance: error: --worlds: {error}", file=sys.stderr)
        return 2
    try:
        machine = _machine(args)
    except ValueError as error:
        print(f"conformance: {error}", file=sys.stderr)
        return 2
    try:
        levels.parse(args.level)
    except ValueError as error:
        print(f"conformance: error: --level: {error}", file=sys.stderr)
        return 2
    impl = chosen(args.impl)
    options = RunOptions(
        impl=impl,
        backend=args.backend,
        worlds=worlds,
        patterns=args.patterns,
        case_timeout=args.case_timeout,
        manifest=_manifest(args, impl),
        strict=args.strict,
        debug_collectives=args.debug_collectives,
        machine=machine,
        on_interrupt=lambda interrupted: _write_reports(args, interrupted),
        level=args.level,
        skip_device_independent=args.skip_device_independent,
    )
    try:
        run = execute(options)
    except (ImportError, NativeLaunchError) as error:
        say(f"conformance: {error}")  # every rank of a native launch says it: one write each
        return 2
    if not run.reporter:
        return 0
    _write_reports(args, run)
    if not run.results:
        print("no case ran: check -k and --worlds", file=sys.stderr)
        return 5
    if options.strict and run.unexpected_passes:
        print(f"--strict: {len(run.unexpected_passes)} unexpected pass(es) of manifest entries", file=sys.stderr)
        return 1
    return 1 if run.failed else 0


def _write_reports(args: argparse.Namespace, run) -> None:
    """The reports ``--json``, ``--junit``, ``--markdown`` and ``--html`` ask for."""
    if args.json:
        report.write_json(run, args.json)
    if args.junit:
        report.write_junit(run, args.junit)
    if args.markdown:
        report.write_markdown([run], args.markdown)
    if args.html:
        report.write_html([run], args.html)
    if args.statement:
        print(statement.write([run], args.statement))


def cmd_list(args: argparse.Namespace) -> int:
    covering: dict[str, list[str]] = {}
    for case in all_cases():
        covering.setdefault(case.id, []).append(f"{case.key} [{','.join(case.worlds)}] {case.level}")
    ids = [e.id for e in catalog.entries()]
    width = max(len(i) for i in ids)
    for id_ in ids + sorted(set(covering) - set(ids)):
        cases = covering.get(id_)
        print(f"{id_:<{width}}  {'; '.join(cases) if cases else 'UNCOVERED'}")
    covered = sum(1 for i in ids if i in covering)
    print(f"\n{covered} of {len(ids)} catalog IDs covered")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    runs = [report.read_json(path) for path in args.runs]
    if args.markdown:
        report.write_markdown(runs, args.markdown)
    if args.html:
        report.write_html(runs, args.html)
    if args.statement:
        try:
            print(statement.write(runs, args.statement))
        except statement.StatementError as error:
            print(f"conformance report: error: --statement: {error}", file=sys.stderr)
            return 2
    if not (args.markdown or args.html or args.statement):
        print("nothing to write: give --markdown, --html and/or --statement", file=sys.stderr)
        return 2
    return 0


def cmd_parity(args: argparse.Namespace) -> int:
    """Exit 0 with no unexplained gap and no stale exclusion, 1 otherwise, 2 on bad input."""
    from .tools import parity

    impl = chosen(args.impl)
    try:
        exclusions = parity.Exclusions.load(args.exclusions or parity.bundled_exclusions(impl))
        result = parity.check(impl, exclusions, args.modules or None)
    except parity.ParityUsageError as error:
        print(f"conformance parity: {error}", file=sys.stderr)
        return 2
    print(result.markdown())
    gaps = result.gaps if args.verbose else result.unexplained
    for finding in gaps:
        reason = result.exclusions.reason(finding.key) or "UNEXPLAINED"
        print(f"{finding.status:9} {finding.key}  [{reason}] {finding.detail}".rstrip())
    for key in result.stale:
        print(f"stale     {key}  (listed as left out, but present and compatible or gone from accelerate)")
    if args.markdown:
        Path(args.markdown).write_text(result.markdown() + "\n", encoding="utf-8")
    return 0 if result.ok else 1


def cmd_shipped(args: argparse.Namespace) -> int:
    from .tools import shipped

    return shipped.main(chosen(args.impl), args.patterns, args.script_timeout, args.logs, args.markdown)


def cmd_agree(args: argparse.Namespace) -> int:
    from .tools import agreement
    from .tools.torchrun import NativeRunError

    try:
        worlds = parse_worlds(args.worlds)
    except ValueError as error:
        print(f"conformance agree: error: --worlds: {error}", file=sys.stderr)
        return 2
    try:
        return agreement.main(chosen(args.impl), worlds, args.patterns, args.exceptions)
    except NativeRunError as error:
        print(f"conformance agree: {str(error).splitlines()[0]}", file=sys.stderr)
        return 2


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    commands = {"run": cmd_run, "list": cmd_list, "report": cmd_report, "parity": cmd_parity, "shipped": cmd_shipped, "agree": cmd_agree,
                "differential": differential_cli.command, "mutation": mutation_cli.command}
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
