"""Unit tests of the engine plugin dataclasses, the FSDP wrap policy and the Accelerator's refusals.

Catalog: plugin.unavailable_engines, plugin.deepspeed_config, plugin.fsdp_wrap_policy, plugin.dynamo.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

import accelerate_ref
from accelerate_ref.utils import (
    BnbQuantizationConfig,
    DDPCommunicationHookType,
    DeepSpeedPlugin,
    DistributedDataParallelKwargs,
    FP8RecipeKwargs,
    FullyShardedDataParallelPlugin,
    MegatronLMPlugin,
    MSAMPRecipeKwargs,
    get_module_class_from_name,
    merge_fsdp_weights,
)
from accelerate_ref.utils.fsdp_utils import require_fsdp_device, wrap_targets

#: Each test builds Accelerators with its own arguments: none may inherit another test's state.
pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


@pytest.mark.parametrize(
    ("build", "error", "text"),
    [
        # a KeyError as HF's (torch's enum lookup), naming the field too (catalog plugin.unavailable_engines)
        (lambda: FullyShardedDataParallelPlugin(sharding_strategy="HALF"), KeyError, "sharding_strategy HALF"),
        (lambda: FullyShardedDataParallelPlugin(state_dict_type="LOCAL"), KeyError, "state_dict_type LOCAL"),
        (lambda: FullyShardedDataParallelPlugin(auto_wrap_policy="layer_wrap"), ValueError, "auto wrap policy: layer_wrap"),
        (lambda: FullyShardedDataParallelPlugin(mixed_precision_policy={"dtype": torch.float16}), ValueError, "mixed precision policy"),
        (lambda: BnbQuantizationConfig(load_in_8bit=True, load_in_4bit=True), ValueError, "load_in_8bit"),
        (lambda: BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_quant_type="int4"), ValueError, "bnb_4bit_quant_type"),
        (lambda: FP8RecipeKwargs(backend="fp9"), ValueError, "backend"),
    ],
)
def test_bad_fields_are_named(build, error, text):
    with pytest.raises(error, match=text):
        build()


def test_values_hf_leaves_unchecked_are_kept():
    """HF 1.15 checks none of these at construction (the engines do): neither does accelerate_ref."""
    assert MegatronLMPlugin(tp_degree=0).megatron_lm_default_args["tensor_model_parallel_size"] == 0
    assert DeepSpeedPlugin(zero_stage=4).deepspeed_config["zero_optimization"]["stage"] == 4
    assert DistributedDataParallelKwargs(comm_wrapper="power_sgd").comm_wrapper == "power_sgd"


def test_fsdp_strategy_by_enum_number_and_name():
    from torch.distributed.fsdp import ShardingStrategy

    assert FullyShardedDataParallelPlugin(sharding_strategy=ShardingStrategy.NO_SHARD).sharding_strategy is ShardingStrategy.NO_SHARD
    assert FullyShardedDataParallelPlugin(sharding_strategy="4").sharding_strategy is ShardingStrategy.HYBRID_SHARD
    assert FullyShardedDataParallelPlugin(sharding_strategy="shard_grad_op").sharding_strategy is ShardingStrategy.SHARD_GRAD_OP


def test_deepspeed_auto_filled_and_contradictions_named(tmp_path):
    config = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "zero_optimization": {"stage": "auto"}}
    plugin = DeepSpeedPlugin(hf_ds_config=config, zero_stage=3, gradient_accumulation_steps=2)
    assert (plugin.get_value("zero_optimization.stage"), plugin.zero3_init_flag) == (3, True)
    plugin.deepspeed_config_process(train_micro_batch_size_per_gpu=4)
    assert plugin.deepspeed_config["train_micro_batch_size_per_gpu"] == 4
    with pytest.raises(ValueError, match="train_micro_batch_size_per_gpu"):
        plugin.deepspeed_config_process(train_micro_batch_size_per_gpu=8)
    with pytest.raises(ValueError, match="zero_optimization.stage"):
        DeepSpeedPlugin(hf_ds_config={**config, "zero_optimization": {"stage": 1}}, zero_stage=2)
    broken = tmp_path / "ds.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="Expecting property name"):  # json's error escapes, as in HF
        DeepSpeedPlugin(hf_ds_config=str(broken))
    assert DeepSpeedPlugin().deepspeed_config["train_batch_size"] == "auto"


class _Layer(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(width, width)


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([_Layer(8), _Layer(2)])
        self.head = torch.nn.Linear(8, 1)


def test_wrap_targets_by_class_size_and_callable():
    model = _Model()
    assert get_module_class_from_name(model, "_Layer") is _Layer
    by_class = FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap="_Layer")
    assert wrap_targets(model, by_class) == ["layers.0", "layers.1"]
    by_size = FullyShardedDataParallelPlugin(auto_wrap_policy="size_based_wrap", min_num_params=50)
    assert wrap_targets(model, by_size) == ["layers.0.inner"]
    head_only = FullyShardedDataParallelPlugin(auto_wrap_policy=lambda module, recurse, nonwrapped_numel: recurse or module is model.head)
    assert wrap_targets(model, head_only) == ["head"]  # FSDP1's policy signature
    with pytest.raises(ValueError, match="Missing"):
        wrap_targets(model, FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Missing"]))


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"megatron_lm_plugin": MegatronLMPlugin()}, ("Megatron is not installed",)),  # HF 1.15's words
        pytest.param(
            {"deepspeed_plugin": DeepSpeedPlugin()},
            ("DeepSpeed is not installed", "pip install deepspeed"),
            marks=pytest.mark.skipif(importlib.util.find_spec("deepspeed") is not None, reason="deepspeed is installed: driven, not refused"),
        ),
        pytest.param(
            {"mixed_precision": "fp8"},
            ("fp8", "transformer_engine"),
            marks=pytest.mark.skipif(accelerate_ref.utils.is_fp8_available(), reason="an FP8 engine is installed: not driven"),
        ),
        ({"mixed_precision": "fp8", "kwargs_handlers": [MSAMPRecipeKwargs()]}, ("fp8", "msamp")),
        ({"fsdp_plugin": FullyShardedDataParallelPlugin(), "megatron_lm_plugin": MegatronLMPlugin()}, ("fsdp_plugin", "megatron_lm_plugin")),
        ({"fsdp_plugin": "FULL_SHARD"}, ("fsdp_plugin",)),
        ({"dynamo_backend": "eager", "dynamo_plugin": accelerate_ref.utils.TorchDynamoPlugin()}, ("dynamo_backend", "dynamo_plugin")),
        ({"parallelism_config": object()}, ("get_device_mesh",)),  # HF 1.15 builds its mesh first
        ({"even_batch": False}, ("even_batch",)),  # a misspelt keyword is not swallowed by the v0.27 ones
    ],
)
def test_accelerator_refuses_naming_argument_and_package(kwargs, names):
    with pytest.raises((ImportError, ValueError, TypeError, NotImplementedError, AttributeError)) as caught:
        accelerate_ref.Accelerator(**kwargs)
    for name in names:
        assert name in str(caught.value)


def test_comm_hook_enum_and_kwargs_exclusion():
    handler = DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.FP16, bucket_cap_mb=10)
    assert handler.comm_hook is DDPCommunicationHookType.FP16
    assert handler.to_kwargs() == {"bucket_cap_mb": 10}
    assert DistributedDataParallelKwargs(comm_hook="fp16").comm_hook == "fp16"  # kept as given, as HF's


def test_merge_refuses_a_directory_without_metadata(tmp_path):
    with pytest.raises(ValueError, match="metadata"):
        merge_fsdp_weights(tmp_path, tmp_path / "out")


def test_fsdp_refuses_devices_torch_cannot_shard_on_by_name():
    require_fsdp_device("cpu")  # torch's fully_shard runs on the CPU over gloo
    with pytest.raises(NotImplementedError, match="XLA devices"):
        require_fsdp_device("xla")
    with pytest.raises(NotImplementedError, match=r"torch\.nosuchdevice\.Stream"):
        require_fsdp_device("nosuchdevice")
