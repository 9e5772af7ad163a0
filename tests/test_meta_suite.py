"""Meta-tests: the conformance suite catches deliberately broken implementations.

Design rule (shared/DESIGN.md, "Rules of thumb"): a case must fail on an
implementation that breaks its rule. Each module of ``tests/broken_impls``
breaks one rule. Here the suite's cases run against each one, restricted to
the cases of the broken rule's area at the smallest world where the break
shows, and we assert that

* the catalog ID(s) of the broken rule (or, to be specific, named cases of
  it) get the expected status: FAIL for a wrong value; ERROR where an
  exception is the natural symptom (a documented name or keyword missing);
  FAIL or HANG for a collective skipped on one rank; CRASH where gloo aborts
  a rank on mismatched buffers;
* every other ID of the selection passes, except the few named as
  collateral (rules that really rest on the broken one);

and, first at each world, the reference `accelerate_ref` runs the union of
the selections used there (isolated breaks' included) and must pass it all
(otherwise a "caught" break would prove nothing).

A break the suite does not report as it should, because of a known weakness
of a case, is entered with ``known_gap`` (a strict xfail naming the
weakness), so that fixing the case shows up here.

Speed: a rank pool costs seconds to start (more on a loaded machine), so
breaks that leave the ranks in a clean state share one pool per world
through `broken_impls.switchboard`, which delegates to the implementation
the driver names before each case, via the suite's own backend
(`SimBackend.run_case`, as the pytest plugin uses it). Breaks that can
leave ranks out of step (a collective skipped on one rank, mismatched
shapes) or damage the process run ``isolated``: through the suite's runner
(`conformance.engine.runner.execute`) with pools of their own. One test also runs
the command line against a broken module end to end.

To reproduce one break by hand::

    PYTHONPATH=tests python -m conformance run --impl broken_impls.print_every_rank --worlds 2 --no-manifest
"""

from __future__ import annotations

import importlib
import io
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import pytest

from conformance.engine.backends import SimBackend
from conformance.engine.case import all_cases, select
from conformance.engine.results import CaseResult, Status
from conformance.engine.runner import DEFAULT_CASE_TIMEOUT, RunOptions, execute
from simulators.topology import World

# broken_impls is a package under tests/; the rank pool passes sys.path on to the ranks.
TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

from broken_impls import switchboard  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

F, E, H, C = Status.FAIL, Status.ERROR, Status.HANG, Status.CRASH
REFERENCE = "accelerate_ref"

#: Case selections, by area, as conformance patterns over IDs.
PROCESS = ("state.attributes", "print.*", "process.*", "sync.*", "trigger.*")
#: Apart from PROCESS: its case starts torchrun, seconds that the other process breaks need not pay.
EXIT = ("state.clean_exit",)
COLLECTIVES = ("gather.*", "gather_object.*", "reduce.*", "pad.*", "broadcast.*", "broadcast_object_list.*", "debug.*")
OPS = ("ops.*",)
INFERENCE = ("split.*",)
METRICS = ("gather_for_metrics.*",)
UTILITIES = ("constants.*", "enums.*", "env.*", "mixed_precision.*", "cpu.*")
COMPAT = ("compat.*",)


@dataclass(frozen=True)
class Break:
    """One implementation run against a selection of cases, and how the suite must report it."""

    #: ``broken_impls.<name>``, or the reference for a control entry.
    impl: str
    #: Catalog ID (or, to be specific where an ID has several cases, a case's function name)
    #: -> statuses that count as caught.
    caught: dict[str, frozenset[Status]]
    world: str
    patterns: tuple[str, ...]
    #: IDs that rest on the broken rule and may fail too; any other ID must pass.
    collateral: frozenset[str] = frozenset()
    #: Run through `execute` with pools of its own instead of the shared switchboard pool.
    isolated: bool = False
    case_timeout: float = DEFAULT_CASE_TIMEOUT
    #: A known weakness of the suite that keeps this break from being reported as
    #: it should be: the entry is an expected failure (strict, so a fix shows up).
    known_gap: str = ""
    #: The break shows only on a machine with CUDA (skipped elsewhere).
    needs_cuda: bool = False

    @property
    def name(self) -> str:
        return self.impl.rpartition(".")[2]

    @property
    def label(self) -> str:
        return f"{self.name}@{self.world}"


def brk(module: str, caught, world: str, patterns: Iterable[str], collateral=(), **options) -> Break:
    """A `Break` of ``broken_impls.<module>``, ``caught`` given as ``{id: status or (statuses)}``."""
    as_sets = {
        cid: frozenset(statuses if isinstance(statuses, (tuple, set, frozenset)) else (statuses,))
        for cid, statuses in caught.items()
    }
    return Break(f"broken_impls.{module}", as_sets, world, tuple(patterns), frozenset(collateral), **options)


BREAKS = [
    # -- process topology and control ---------------------------------------
    brk(
        "local_index_from_global",
        {"state.attributes": F, "process.is_local_main": F, "print.once_per_server": F},
        "2x2",
        PROCESS,
        # Every per-machine rule rests on local_process_index.
        collateral={"process.on_local_main_process", "process.on_local_process", "sync.local_main_process_first"},
    ),
    brk("print_every_rank", {"print.once_per_server": F}, "2", PROCESS),
    brk("exit_leaves_process_group", {"state.clean_exit": F}, "2", EXIT),
    brk("on_main_every_machine", {"process.on_main_process": F}, "2x2", PROCESS),
    brk(
        "wait_skips_barrier",
        {"sync.wait_for_everyone": F},
        "2",
        PROCESS,
        # main_process_first is built on the barrier.
        collateral={"sync.main_process_first", "sync.local_main_process_first"},
    ),
    brk("main_first_no_wait", {"sync.main_process_first": F}, "2", PROCESS),
    brk("trigger_not_reset", {"trigger.set_check": F}, "2", PROCESS),
    brk("trigger_local_only", {"trigger.set_check": F}, "2", PROCESS),
    brk("on_process_ignores_index", {"process.on_process": F}, "2", PROCESS),
    brk("on_last_process_runs_on_main", {"process.on_last_process": F}, "2", PROCESS),
    brk("on_local_process_uses_global_index", {"process.on_local_process": F}, "2x2", PROCESS),
    brk("local_main_first_no_wait", {"sync.local_main_process_first": F}, "2", PROCESS),
    brk(
        "main_on_every_machine",
        {"process.is_main": F, "state.attributes": F},
        "2x2",
        PROCESS,
        # Rules that single out the main process.
        collateral={"process.on_main_process", "sync.main_process_first", "sync.wait_for_everyone"},
    ),
    # -- collectives ------------------------------------------------------------
    brk("mean_as_sum", {"reduce.mean": F, "reduce.nested": F}, "2", COLLECTIVES),
    brk("reduce_none_sums", {"reduce.none": F}, "2", COLLECTIVES),
    brk("reduce_default_sum", {"reduce.mean": F}, "2", COLLECTIVES),
    brk(
        "gather_reversed",
        {"gather.doc_example": F, "gather.first_dim": F, "gather.nested": F, "gather.scalar": F},
        "4",
        COLLECTIVES,
    ),
    brk("gather_scalar_flat", {"gather.scalar": F}, "2", COLLECTIVES),
    brk("gather_nested_tuples_as_lists", {"gather.nested": F}, "2", COLLECTIVES),
    brk("gather_object_dict_keys", {"gather_object.structures": F}, "2", COLLECTIVES),
    brk("gather_object_not_flattened", {"gather_object.nested": F}, "2", COLLECTIVES),
    brk("pad_ignored", {"pad.doc_example": F, "pad.pad_first_index_dim": F}, "2", COLLECTIVES),
    brk("pad_first_ignored", {"pad.pad_first_index_dim": F}, "2", COLLECTIVES),
    brk("pad_index_ignored", {"pad.pad_first_index_dim": F}, "2", COLLECTIVES),
    brk(
        "broadcast_from_zero",
        {"broadcast.from_process": F},
        "2",
        COLLECTIVES,
        # The debug-mode broadcast case broadcasts from the last rank as its control.
        collateral={"debug.shape_mismatch"},
    ),
    brk("broadcast_object_list_copy", {"broadcast_object_list.in_place": F}, "2", COLLECTIVES),
    # (Duplicates kept by gather_for_metrics: broken_impls.data_gather_for_metrics_keeps_duplicates,
    # in test_meta_data.py with the other data-loading breaks.)
    # A keyword the implementation lacks is a TypeError in a script: ERROR.
    brk("gather_for_metrics_no_use_gather_object", {"gather_for_metrics.use_gather_object": E}, "2", METRICS),
    # The other ranks block in all_gather: HANG, or FAIL when the last rank's own
    # wrong result is reported as the cause. Later cases must still run and pass.
    brk(
        "collective_skipped_on_one_rank",
        {"gather.first_dim": (F, H)},
        "2",
        ("gather.first_dim", "reduce.mean", "broadcast.from_process"),
        isolated=True,
        case_timeout=4.0,
    ),
    # Without the check gloo gets buffers of different sizes: on gather and reduce it
    # aborts the rank that receives more than it expects (CRASH; were it to wait
    # instead, HANG); broadcast goes through with the wrong data or an error that
    # names no shapes (FAIL).
    brk(
        "debug_mode_ignored",
        {"debug_shape_mismatch_gather": (C, H), "debug_shape_mismatch_reduce": (C, H), "debug_shape_mismatch_broadcast": F},
        "2",
        ("debug.*",),
        isolated=True,
        case_timeout=4.0,
    ),
    # -- local operations ---------------------------------------------------------
    brk("send_to_device_ignores_skip_keys", {"ops.send_to_device": F}, "1", OPS),
    brk("concatenate_ignores_dim", {"ops.concatenate": F}, "1", OPS),
    brk("recursively_apply_never_raises", {"ops.recursively_apply": F}, "1", OPS),
    brk("slice_tensors_drops_others", {"ops.slice_tensors": F}, "1", OPS),
    brk("convert_to_fp32_all_floats", {"ops.convert_to_fp32": F}, "1", OPS),
    brk("listify_keeps_tensors", {"ops.listify": F}, "1", OPS),
    # -- utilities ---------------------------------------------------------------------
    brk("constants_wrong", {"constants.names": F}, "1", UTILITIES),
    # A documented name missing is an AttributeError in a script: ERROR.
    brk("constant_missing", {"constants.names": E}, "1", UTILITIES),
    brk("enum_value_wrong", {"enums.values": F}, "1", UTILITIES),
    brk("distributed_type_not_reexported", {"enums.values": F}, "1", UTILITIES),
    brk("patch_environment_leaks", {"env.patch_environment": F}, "1", UTILITIES),
    brk("patch_environment_keeps_case", {"env.patch_environment": F}, "1", UTILITIES),
    brk("patch_environment_not_restored_on_error", {"env.patch_environment": F}, "1", UTILITIES),
    brk("clear_environment_keeps_changes", {"env.clear_environment": F}, "1", UTILITIES),
    brk("clear_environment_not_cleared", {"env.clear_environment": F}, "1", UTILITIES),
    brk("torch_version_reversed", {"env.checks": F}, "1", UTILITIES),
    brk("comet_ml_never_available", {"env.checks": F}, "1", UTILITIES),
    brk("mixed_precision_env_ignored", {"mixed_precision_env_default": F}, "1", UTILITIES),
    brk("mixed_precision_env_overrides_argument", {"mixed_precision_argument_wins": F}, "1", UTILITIES),
    brk("grad_accum_env_ignored", {"mixed_precision_env_default": F}, "1", UTILITIES),
    brk("cpu_flag_ignored", {"cpu.flag": F}, "1", UTILITIES, needs_cuda=True),
    # -- compatibility across documented versions (issue 13) ----------------------
    brk("compat_v027_keywords_ignored", {"compat.v027_dataloader_kwargs": F}, "1", COMPAT),
    brk("compat_autocast_cache_enabled_ignored", {"compat.autocast_cache_enabled": F}, "1", COMPAT),
    # -- inference helpers ----------------------------------------------------------
    brk("split_no_padding", {"split.padding": F}, "2", INFERENCE, collateral={"split.fewer_inputs_than_ranks"}),
    brk(
        "split_uneven_extras_last",
        {"split.doc_example": F},
        "2",
        INFERENCE,
        # Every split rule at an uneven count sees the shares move.
        collateral={"split.padding", "split.tensor_dict", "split.fewer_inputs_than_ranks"},
    ),
    brk("split_dict_unchecked", {"split.tensor_dict": F}, "2", INFERENCE),
    brk("split_empty_share_filled", {"split.fewer_inputs_than_ranks": F}, "2", INFERENCE),
    brk("split_pads_with_share_last", {"split.padding": F}, "4", INFERENCE),
]


def _world_order(label: str) -> tuple[int, str]:
    return World.parse(label).size, label


def plan(breaks: list[Break], case_timeout: float = DEFAULT_CASE_TIMEOUT) -> list[Break]:
    """Shared-pool entries grouped by world, each group led by a reference control (cases get
    ``case_timeout``) over the union of the patterns any entry uses at that world (isolated ones
    included); then the isolated ones."""
    entries: list[Break] = []
    for world in sorted({b.world for b in breaks}, key=_world_order):
        here = [b for b in breaks if b.world == world]
        patterns = tuple(dict.fromkeys(p for b in here for p in b.patterns))
        entries.append(Break(REFERENCE, {}, world, patterns, case_timeout=case_timeout))
        entries.extend(b for b in here if not b.isolated)
    return entries + [b for b in breaks if b.isolated]


PLAN = plan(BREAKS)


class SharedPools:
    """One `SimBackend` (or a subclass: ``sim-xla``, ``sim-npu``) over `broken_impls.switchboard`:
    pools live across entries of the same world."""

    def __init__(self, choice_file: Path, backend: type[SimBackend] = SimBackend) -> None:
        self.choice_file = choice_file
        self.backend = backend("broken_impls.switchboard", DEFAULT_CASE_TIMEOUT)

    def run(self, entry: Break) -> list[CaseResult]:
        self.backend.case_timeout = entry.case_timeout
        # Read when a pool (re)starts: the reference (which brings torch and the bulk of
        # the imports) and this entry's implementation are imported then, within the start
        # timeout. A later entry's broken copy is imported in its first case, in a fraction
        # of a second; preloading them all would slow every restart of the pool (one follows
        # each case whose ranks disagree).
        preload = ",".join(dict.fromkeys([REFERENCE, entry.impl]))
        self.backend.base_env = {
            **type(self.backend).base_env,
            switchboard.CHOICE_ENV: str(self.choice_file),
            switchboard.PRELOAD_ENV: preload,
        }
        world = World.parse(entry.world)
        results = []
        for case in (c for c in select(all_cases(), entry.patterns) if c.runs_at(entry.world) and self.backend.runs(c)):
            self.choice_file.write_text(entry.impl, encoding="utf-8")
            results.append(self.backend.run_case(case, world))
        return results

    def close(self) -> None:
        self.backend.close()


@pytest.fixture(scope="module")
def shared_pools(tmp_path_factory):
    pools = SharedPools(tmp_path_factory.mktemp("switchboard") / "choice")
    yield pools
    pools.close()


def _describe(result: CaseResult) -> str:
    message = "\n      ".join(result.message.splitlines()[:12]) or "(no message)"
    return f"{result.id} [{result.case}] at world {result.world}: {result.status.value}\n      {message}"


def _summary(results: list[CaseResult]) -> str:
    return "\n".join(f"    {r.status.value:<13} {r.id} [{r.case}] world={r.world}" for r in results)


def _problems(entry: Break, results: list[CaseResult]) -> list[str]:
    """What the suite reported wrongly about ``entry``: a break not caught, or an unrelated ID not passing."""
    problems = []
    for key, statuses in entry.caught.items():
        expected = " or ".join(sorted(s.value for s in statuses))
        found = [r for r in results if key in (r.id, r.case)]
        if not found:
            problems.append(f"{key} did not run at world {entry.world}: no case for it there, or the patterns miss it")
        problems += [
            f"{key} not caught: expected {expected}, got {_describe(r)}" for r in found if r.status not in statuses
        ]
    unrelated = [
        r for r in results if r.id not in entry.collateral and not any(key in (r.id, r.case) for key in entry.caught)
    ]
    problems += [f"unrelated ID: expected PASS, got {_describe(r)}" for r in unrelated if r.status is not Status.PASS]
    return problems


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _param(entry: Break):
    marks = [pytest.mark.xfail(strict=True, reason=entry.known_gap)] if entry.known_gap else []
    if entry.needs_cuda:
        marks.append(pytest.mark.skipif(not _cuda(), reason=f"{entry.impl} differs from the rule only where CUDA exists"))
    return pytest.param(entry, id=entry.label, marks=marks)


@pytest.mark.parametrize("entry", [_param(e) for e in PLAN])
def test_suite_reports(entry: Break, request) -> None:
    # Imported here too, so that what the ranks return unpickles in the driver.
    importlib.import_module(entry.impl)
    if entry.isolated:
        options = RunOptions(
            impl=entry.impl,
            worlds=[entry.world],
            patterns=list(entry.patterns),
            case_timeout=entry.case_timeout,
            manifest=None,
        )
        results = execute(options, out=io.StringIO()).results
    else:
        results = request.getfixturevalue("shared_pools").run(entry)
    assert results, f"{entry.impl}: no case ran for patterns {list(entry.patterns)} at world {entry.world}"
    # Shown with ``pytest -rP``: what the suite reported for the broken rule.
    print(f"{entry.label}: " + (", ".join(
        f"{r.case}={r.status.value}" for r in results if any(key in (r.id, r.case) for key in entry.caught)
    ) or f"{len(results)} results, {sum(r.status is Status.PASS for r in results)} PASS"))
    problems = _problems(entry, results)
    if entry.impl == REFERENCE:
        headline = "the reference must pass every case the meta-tests use, or a caught break proves nothing"
    else:
        headline = f"break {entry.impl} was not reported as it should be"
    assert not problems, (
        f"{headline} (world {entry.world}, patterns {list(entry.patterns)}):\n  - "
        + "\n  - ".join(problems)
        + f"\n\nall results:\n{_summary(results)}"
    )


def test_command_line_reports_a_break() -> None:
    """``python -m conformance run --impl broken_impls.<break>`` exits non-zero and names the failing ID."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")]))}
    command = [
        sys.executable, "-m", "conformance", "run", "--impl", "broken_impls.print_every_rank",
        "--worlds", "2", "-k", "print.*", "--no-manifest",
    ]
    done = subprocess.run(command, cwd=TESTS_DIR.parent, env=env, capture_output=True, text=True, timeout=240)
    output = done.stdout + done.stderr
    assert done.returncode != 0, f"a run with a failing case must exit non-zero, got 0:\n{output}"
    assert "FAIL print.once_per_server" in output, f"the report should name the failing ID:\n{output}"
    assert "broken_impls.print_every_rank" in output, f"the run header should name the implementation:\n{output}"


def _all_meta_breaks() -> list[Break]:
    """The `BREAKS` of every ``tests/test_meta_*.py`` module (this one and those built on it)."""
    breaks = []
    for path in sorted(TESTS_DIR.glob("test_meta_*.py")):
        name = f"{__package__}.{path.stem}" if __package__ else path.stem
        breaks += getattr(importlib.import_module(name), "BREAKS", [])
    return breaks


def test_every_break_is_planned_and_documented() -> None:
    """Each module of broken_impls has an entry in a meta-test, and its docstring names the catalog ID
    that must catch it."""
    import pkgutil

    import broken_impls

    breaks = _all_meta_breaks()
    # diff_* breaks are the differential harness's, planned by tests/test_differential.py (which checks them)
    modules = {m.name for m in pkgutil.iter_modules(broken_impls.__path__)
               if not m.name.startswith(("_", "diff_"))} - {"switchboard"}
    planned = {b.name for b in breaks}
    assert not modules - planned, f"broken modules no meta-test runs (no entry in any BREAKS): {sorted(modules - planned)}"
    assert not planned - modules, f"BREAKS entries with no module in broken_impls: {sorted(planned - modules)}"
    id_of_case = {c.name: c.id for c in all_cases()}
    unknown = [f"{b.impl}: {key}" for b in breaks for key in b.caught if key not in id_of_case and key not in id_of_case.values()]
    assert not unknown, f"BREAKS entries expecting IDs or cases the suite does not have: {unknown}"
    undocumented = []
    for b in breaks:
        doc = importlib.import_module(b.impl).__doc__ or ""
        wanted = {id_of_case.get(key, key) for key in b.caught}
        undocumented += [f"{b.impl}: docstring does not name {cid}" for cid in sorted(wanted) if cid not in doc]
    assert not undocumented, "a broken module's docstring names the rule it breaks and what catches it:\n" + "\n".join(undocumented)


def test_broken_copies_leave_the_reference_alone() -> None:
    """Loading every broken module never imports the real accelerate_ref (its copies import relatively),
    so a break can neither leak into the reference nor miss half of the copy."""
    code = (
        "import importlib, pkgutil, sys, broken_impls\n"
        "for m in pkgutil.iter_modules(broken_impls.__path__):\n"
        "    if not m.name.startswith('_') and m.name != 'switchboard':\n"
        "        importlib.import_module('broken_impls.' + m.name)\n"
        "leaked = sorted(k for k in sys.modules if k == 'accelerate_ref' or k.startswith('accelerate_ref.'))\n"
        "assert not leaked, f'the copies imported the real reference: {leaked}'\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", code], cwd=TESTS_DIR.parent, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"importing the broken implementations failed:\n{done.stdout}{done.stderr}"
