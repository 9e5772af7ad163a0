"""Meta-tests of the "Training" cases: each ``broken_impls.train_*`` module must be reported.

The machinery is `support`'s (`Break`, shared switchboard pools,
isolated runs, the comparison of what was reported with what must be); this
module only lists the training breaks and how each must show. Every world
used here first runs the reference over the union of the selections, which
must pass.

Training cases build ``DistributedDataParallel`` models, and torch imports
``torch._dynamo`` (seconds) the first time a process builds one: the entries
here run with `CASE_TIMEOUT`, not the suite's 6 s default, so that the first
DDP case of each pool is not taken for a hang.

To reproduce one break by hand::

    PYTHONPATH=tests/conformance/meta python -m conformance run --impl broken_impls.train_no_sync_syncs --worlds 2 -k 'no_sync.*' --no-manifest --case-timeout 30
"""

from __future__ import annotations

import pytest

from conformance.engine.case import DEFAULT_CASE_TIMEOUT
from tests.conformance.meta.support import Break, E, F, H, brk, judge, plan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

#: Seconds before a case is a HANG here (see the module docstring).
CASE_TIMEOUT = 30.0

PREPARE = ("prepare.*", "train.*")
ACCUMULATION = ("backward.*", "accumulate.*", "no_sync.*")
GRADIENTS = ("clip.*", "unscale.*", "autocast.*")
RUNTIME = ("free_memory.*", "seed.*", "memory.*", "profile.*", "kwargs.*")
#: Cases of accumulation that compare gradients with the one-process replay.
REPLAYED = {"accumulate.doc_example", "accumulate.plugin", "accumulate.end_of_dataloader"}


def tbrk(module: str, caught, world: str, patterns, collateral=(), **options) -> Break:
    return brk(module, caught, world, patterns, collateral, case_timeout=options.pop("case_timeout", CASE_TIMEOUT), **options)


BREAKS = [
    # -- prepare ----------------------------------------------------------------------
    tbrk("train_placement_list_ignored", {"prepare.device_placement_list": F}, "2", PREPARE),
    tbrk("train_unwrap_returns_wrapper", {"prepare.unwrap": F, "prepare.order": F}, "2", PREPARE),
    tbrk("train_evaluation_mode_wraps", {"prepare.evaluation_mode": F}, "2", PREPARE),
    tbrk("train_device_map_not_verified", {"prepare.verify_device_map": F}, "2", PREPARE),
    tbrk(
        "train_no_ddp_wrapper",
        {"train.ddp_equivalence": F, "prepare.unwrap": F},
        "2",
        PREPARE + ACCUMULATION,
        # Every rule that rests on synchronised gradients.
        collateral=REPLAYED | {"no_sync.doc_example", "no_sync.trigger_sync_in_backward"},
    ),
    # -- backward and accumulation --------------------------------------------------------
    tbrk(
        "train_accumulate_syncs_every_step",
        {"accumulate_doc_example": F, "accumulate_plugin": F, "accumulate_end_of_dataloader": F, "accumulate_scheduler": F},
        "2",
        ACCUMULATION,
    ),
    tbrk("train_end_of_dataloader_ignored", {"accumulate.end_of_dataloader": F}, "2", ACCUMULATION),
    tbrk(
        "train_optimizer_steps_while_accumulating",
        {"accumulate.doc_example": F, "accumulate.plugin": F, "accumulate.end_of_dataloader": F},
        "2",
        ACCUMULATION,
        # The scheduler follows an optimizer that now steps while accumulating.
        collateral={"accumulate.scheduler"},
    ),
    tbrk("train_scheduler_steps_per_micro_batch", {"accumulate_scheduler": F}, "2", ACCUMULATION),
    tbrk(
        "train_backward_not_scaled",
        {"backward_loss_scaled_under_accumulation": F, **{cid: F for cid in REPLAYED}},
        "2",
        ACCUMULATION,
    ),
    tbrk("train_no_sync_syncs", {"no_sync.doc_example": F}, "2", ACCUMULATION,
         collateral=REPLAYED | {"no_sync.trigger_sync_in_backward"}),
    tbrk("train_trigger_sync_ignored", {"no_sync.trigger_sync_in_backward": F}, "2", ACCUMULATION),
    # -- gradients and mixed precision ------------------------------------------------------
    tbrk("train_clip_norm_does_not_clip", {"clip_grad_norm": F, "clip_grad_norm_after_unscaling": F}, "2", GRADIENTS),
    tbrk("train_fp16_without_scaler", {"autocast.fp16_scaler": F}, "2", GRADIENTS),
    tbrk("train_autocast_kwargs_ignored", {"autocast.bf16": F}, "2", GRADIENTS),
    # -- memory, profiling, handlers ---------------------------------------------------------
    tbrk("train_free_memory_keeps_references", {"free_memory.resets": F}, "2", RUNTIME),
    tbrk("train_ddp_kwargs_ignored", {"kwargs.ddp": (F, E)}, "2", RUNTIME),
    tbrk("train_batch_size_reduced_by_tenth", {"memory.find_executable_batch_size": F}, "1", RUNTIME),
    tbrk("train_profile_trace_not_written", {"profile.context": F}, "1", RUNTIME),
    # The longer ranks wait in DDP's all-reduce for ranks that left: only the case timeout ends it, the suite's
    # default, as the case asks (the ranks' fork server imported torch._dynamo, which a first DDP build imports).
    tbrk("train_join_does_nothing", {"join.uneven_inputs": H}, "2", ("join.*",), isolated=True,
         case_timeout=DEFAULT_CASE_TIMEOUT),
]




@pytest.mark.parametrize("entry", plan(BREAKS, CASE_TIMEOUT), ids=lambda e: e.label)
def test_training_break_reported(entry: Break, request) -> None:
    judge(entry, request)
