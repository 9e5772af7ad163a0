"""Meta-tests of the "Plugins and engines" cases: each ``broken_impls.plugin_*`` module must be reported.

The machinery is `support`'s; this module lists the plugin breaks
(the five of issue 12, and FSDP and DeepSpeed load_states that skip the optimizer) and how each must show. Each world first runs the
reference over the union of the selections, which must pass. FSDP cases
build a device mesh and dynamo compiles: entries run with `CASE_TIMEOUT`.

To reproduce one break by hand::

    PYTHONPATH=tests/conformance/meta python -m conformance run --impl broken_impls.plugin_fsdp_does_not_shard --worlds 2 -k 'plugin.fsdp*' --no-manifest --case-timeout 60
"""

from __future__ import annotations

import importlib.util

import pytest

from tests.conformance.meta.support import Break, E, F, brk, judge, plan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

#: Seconds before a case is a HANG here (see the module docstring).
CASE_TIMEOUT = 60.0

FSDP = ("plugin.fsdp", "plugin.fsdp_strategies", "plugin.fsdp_state_dict")
SINGLE = ("plugin.dynamo", "plugin.deepspeed_config")


def pbrk(module: str, caught, world: str, patterns, collateral=()) -> Break:
    return brk(module, caught, world, patterns, collateral, case_timeout=CASE_TIMEOUT)


BREAKS = [
    pbrk(
        "plugin_fsdp_does_not_shard",
        {"plugin.fsdp": F, "plugin_fsdp_strategy_full_shard": F, "plugin_fsdp_strategy_shard_grad_op": F},
        "2",
        FSDP,
        # The state dict cases also check that the model they save is sharded.
        collateral={"plugin.fsdp_state_dict"},
    ),
    pbrk(
        "plugin_sharded_save_rank_zero_only",
        {"plugin_fsdp_state_dict_sharded": (F, E), "plugin_fsdp_save_state_sharded": (F, E)},
        "2",
        FSDP,
    ),
    pbrk(
        "plugin_load_state_skips_optimizer",
        {"plugin_fsdp_save_state_full": F, "plugin_fsdp_save_state_sharded": F},
        "2",
        ("plugin_fsdp_save_state*",),
    ),
    # By case name: the bf16 case of the ID is NOT_SUPPORTED on gloo (a torch limit).
    pbrk("plugin_comm_hook_not_registered", {"plugin_ddp_comm_hook": F}, "2", ("plugin_ddp_comm_hook",)),
    pbrk("plugin_dynamo_not_compiled", {"plugin.dynamo": F}, "1", SINGLE),
    # Issue 13: regional compilation (TorchDynamoPlugin.use_regional_compilation) ignored.
    pbrk("plugin_dynamo_regional_ignored", {"plugin_dynamo_regional": F}, "1", SINGLE),
    # Issue 32: equivalence within torch's tolerances (no bit equality, which a GPU does not give) still fails this.
    pbrk("plugin_dynamo_outputs_differ", {"plugin.dynamo": F}, "1", SINGLE),
    pbrk("plugin_dynamo_regional_fsdp_wraps", {"plugin_dynamo_regional_fsdp": (F, E)}, "2", ("plugin_dynamo_regional_fsdp",)),
    pbrk("plugin_deepspeed_auto_unfilled", {"plugin_deepspeed_config": F}, "1", SINGLE),
]
#: Breaks that show only where the deepspeed package is installed (without it the ZeRO cases are NOT_SUPPORTED).
DEEPSPEED_BREAKS = [
    pbrk("plugin_deepspeed_steps_every_batch", {"plugin_deepspeed_accumulation": F}, "2", ("plugin.deepspeed_zero",)),
    pbrk("plugin_deepspeed_offload_adam_mode", {"plugin_deepspeed_offload_optimizer": F}, "2", ("plugin_deepspeed_offload_optimizer",)),
    pbrk("plugin_deepspeed_select_keeps_first", {"plugin_deepspeed_several_plugins": F}, "2", ("plugin_deepspeed_several_plugins",)),
    pbrk("plugin_deepspeed_scheduler_steps_twice", {"plugin_deepspeed_dummy_optim": F}, "2", ("plugin_deepspeed_dummy_optim",)),
    pbrk("plugin_deepspeed_load_state_skips_optimizer", {"plugin_deepspeed_save_state": F}, "2", ("plugin_deepspeed_save_state",)),
]
#: The DeepSpeed breaks run under ``make extended`` (each ZeRO case trains a DeepSpeed engine at world 2: with their
#: reference control, about 4 minutes), where deepspeed is installed; the others in ``make test``.
RUNNABLE_DEEPSPEED = DEEPSPEED_BREAKS if importlib.util.find_spec("deepspeed") is not None else []

#: Issue 13: breaks that show only where bitsandbytes is installed (without it the quantization case is NOT_SUPPORTED).
BNB_BREAKS = [pbrk("quantization_not_quantized", {"quantization.load_and_quantize": F}, "1", ("quantization.*",))]
RUNNABLE = BREAKS + (BNB_BREAKS if importlib.util.find_spec("bitsandbytes") is not None else [])


@pytest.mark.parametrize("entry", plan(RUNNABLE, CASE_TIMEOUT), ids=lambda e: e.label)
def test_plugin_break_reported(entry: Break, request) -> None:
    judge(entry, request)


@pytest.mark.extended
@pytest.mark.parametrize("entry", plan(RUNNABLE_DEEPSPEED, CASE_TIMEOUT), ids=lambda e: e.label)
def test_deepspeed_break_reported(entry: Break, request) -> None:
    judge(entry, request)
