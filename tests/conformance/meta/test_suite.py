"""Meta-tests: the conformance suite catches deliberately broken implementations.

Design rule (shared/DESIGN.md, "Rules of thumb"): a case must fail on an
implementation that breaks its rule. Each module of ``tests/conformance/meta/broken_impls``
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

    PYTHONPATH=tests/conformance/meta python -m conformance run --impl broken_impls.print_every_rank --worlds 2 --no-manifest
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conformance.meta.support import (
    COLLECTIVES,
    COMPAT,
    EXIT,
    INFERENCE,
    META_DIR,
    METRICS,
    OPS,
    PROCESS,
    UTILITIES,
    Break,
    C,
    E,
    F,
    H,
    brk,
    expect_documented,
    judge,
    param,
    plan,
    planned_modules,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

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
    # in test_data.py with the other data-loading breaks.)
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
    brk("compat_v027_warning_misplaced", {"compat.v027_dataloader_kwargs": F}, "1", COMPAT),
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


PLAN = plan(BREAKS)


@pytest.mark.parametrize("entry", [param(e) for e in PLAN])
def test_suite_reports(entry: Break, request) -> None:
    judge(entry, request)


def test_command_line_reports_a_break() -> None:
    """``python -m conformance run --impl broken_impls.<break>`` exits non-zero and names the failing ID."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(META_DIR), os.environ.get("PYTHONPATH")]))}
    command = [
        sys.executable, "-m", "conformance", "run", "--impl", "broken_impls.print_every_rank",
        "--worlds", "2", "-k", "print.*", "--no-manifest",
    ]
    done = subprocess.run(command, cwd=META_DIR.parents[2], env=env, capture_output=True, text=True, timeout=240)
    output = done.stdout + done.stderr
    assert done.returncode != 0, f"a run with a failing case must exit non-zero, got 0:\n{output}"
    assert "FAIL print.once_per_server" in output, f"the report should name the failing ID:\n{output}"
    assert "broken_impls.print_every_rank" in output, f"the run header should name the implementation:\n{output}"


def test_every_break_is_planned_and_documented() -> None:
    """Each module of broken_impls has an entry in a meta-test (read from the meta-tests' sources); what each
    entry expects, and its module's docstring, are checked when the entry runs (`support.judge`)."""
    import pkgutil

    import broken_impls

    # diff_* breaks are the differential harness's, planned by tests/conformance/tools/test_differential.py
    modules = {m.name for m in pkgutil.iter_modules(broken_impls.__path__)
               if not m.name.startswith(("_", "diff_"))} - {"switchboard"}
    planned = planned_modules()
    assert not modules - set(planned), f"broken modules no meta-test runs (no entry in any test module here): {sorted(modules - set(planned))}"
    for b in BREAKS:
        expect_documented(b)


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
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(META_DIR), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", code], cwd=META_DIR.parents[2], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"importing the broken implementations failed:\n{done.stdout}{done.stderr}"
