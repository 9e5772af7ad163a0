"""Issue 13's FSDP names: each behaves as HF accelerate 1.15's does.

`FullyShardedDataParallelPlugin` is built by HF and by accelerate_ref from the
same arguments and environment and every field compared (torch's enums,
configs, policies); HF's FSDP helpers and accelerate_ref's run on the same
inputs. One launch at world 2 (`fsdp_rank_functions.all_checks`) shows the
fields taking effect in torch's ``fully_shard`` and the save/load functions
reading each other's checkpoints. Catalog: plugin.fsdp, plugin.fsdp_strategies,
plugin.fsdp_state_dict, plugin.fsdp_wrap_policy.
"""

from __future__ import annotations

import enum
import functools
import importlib
import os
from unittest import mock

import pytest
import torch

hf_constants = pytest.importorskip("accelerate.utils.constants")

import accelerate.utils.fsdp_utils as hf_fsdp  # noqa: E402
from accelerate.utils import FullyShardedDataParallelPlugin as HFPlugin  # noqa: E402

import simulators  # noqa: E402
from accelerate_ref.utils import FullyShardedDataParallelPlugin as RefPlugin  # noqa: E402
from accelerate_ref.utils import constants as ref_constants  # noqa: E402
from accelerate_ref.utils import fsdp_utils as ref_fsdp  # noqa: E402
from tests.accelerate_ref.utils import fsdp_rank_functions  # noqa: E402
from tests.accelerate_ref.utils.fsdp_rank_functions import Block, net  # noqa: E402

FSDP_CONSTANTS = [
    "FSDP_SHARDING_STRATEGY",
    "FSDP_AUTO_WRAP_POLICY",
    "FSDP_BACKWARD_PREFETCH",
    "FSDP_STATE_DICT_TYPE",
    "FSDP2_STATE_DICT_TYPE",
    "FSDP_PYTORCH_VERSION",
    "FSDP2_PYTORCH_VERSION",
]

REEXPORTS = [
    ("accelerate_ref.accelerator", "accelerate.accelerator", ["FSDP_PYTORCH_VERSION", "FSDP2_PYTORCH_VERSION"]),
    ("accelerate_ref.utils.other", "accelerate.utils.other", ["FSDP_PYTORCH_VERSION"]),
    ("accelerate_ref.utils.dataclasses", "accelerate.utils.dataclasses",
     ["FSDP2_PYTORCH_VERSION", "FSDP_AUTO_WRAP_POLICY", "FSDP_BACKWARD_PREFETCH", "FSDP_SHARDING_STRATEGY"]),
]

PLUGIN_FIELDS = [
    "fsdp_version", "sharding_strategy", "reshard_after_forward", "backward_prefetch", "mixed_precision_policy",
    "auto_wrap_policy", "cpu_offload", "ignored_modules", "state_dict_type", "state_dict_config",
    "optim_state_dict_config", "limit_all_gathers", "use_orig_params", "param_init_fn", "sync_module_states",
    "forward_prefetch", "activation_checkpointing", "activation_checkpointing_offload", "cpu_ram_efficient_loading",
    "transformer_cls_names_to_wrap", "min_num_params",
]


def _normal(value):
    """A comparable form of a plugin field: torch's enums, configs, policies and functions by kind and content."""
    if isinstance(value, enum.Enum):
        return (type(value).__name__, value.value)
    if isinstance(value, functools.partial):
        return ("partial", value.func.__qualname__, {k: _normal(v) for k, v in value.keywords.items()})
    if isinstance(value, (set, frozenset)):
        return sorted(map(repr, value))
    if callable(value) and hasattr(value, "__qualname__"):
        return ("function", value.__qualname__)
    if type(value).__module__.startswith("torch"):
        return (type(value).__name__, repr(value))
    return value


def _fields(plugin) -> dict:
    return {name: _normal(getattr(plugin, name)) for name in PLUGIN_FIELDS}


def _build(plugin_class, kwargs: dict, env: dict):
    """A plugin built under ``env`` only (FSDP_* variables cleared); what the plugin writes to the environment is undone."""
    clean = {key: value for key, value in os.environ.items() if not key.startswith("FSDP_")}
    with mock.patch.dict(os.environ, {**clean, **env}, clear=True):
        return plugin_class(**kwargs)


@pytest.mark.parametrize("name", FSDP_CONSTANTS)
def test_fsdp_constant_equals_hf(name: str) -> None:
    assert getattr(ref_constants, name) == getattr(hf_constants, name)


@pytest.mark.parametrize(("ref_module", "hf_module", "names"), REEXPORTS, ids=[r[0] for r in REEXPORTS])
def test_modules_reexport_fsdp_constants(ref_module: str, hf_module: str, names: list[str]) -> None:
    ref, hf = importlib.import_module(ref_module), importlib.import_module(hf_module)
    assert {n: getattr(ref, n) for n in names} == {n: getattr(hf, n) for n in names}


PLUGIN_CASES = [
    ({}, {}),
    ({"fsdp_version": 2}, {}),
    ({"sharding_strategy": "shard_grad_op"}, {}),
    ({"sharding_strategy": "4"}, {}),
    ({"reshard_after_forward": "NO_SHARD"}, {}),
    ({"fsdp_version": 2, "reshard_after_forward": "false"}, {}),
    ({"backward_prefetch": "backward_post", "forward_prefetch": True, "limit_all_gathers": False}, {}),
    ({"backward_prefetch": "NO_PREFETCH", "use_orig_params": True}, {}),
    ({"fsdp_version": 2, "backward_prefetch": "BACKWARD_PRE", "use_orig_params": True}, {}),
    ({"state_dict_type": "sharded_state_dict"}, {}),
    ({"state_dict_type": "LOCAL_STATE_DICT"}, {}),
    ({"fsdp_version": 2, "state_dict_type": "1"}, {}),
    ({"mixed_precision_policy": "bf16"}, {}),
    ({"fsdp_version": 2, "mixed_precision_policy": "fp16"}, {}),
    ({"mixed_precision_policy": {"param_dtype": torch.bfloat16, "reduce_dtype": torch.float32, "buffer_dtype": torch.float32}}, {}),
    ({"cpu_offload": True}, {}),
    ({"fsdp_version": 2, "cpu_offload": True, "ignored_modules": "head"}, {}),
    ({"auto_wrap_policy": "transformer_based_wrap", "transformer_cls_names_to_wrap": "Block,Other"}, {}),
    ({"auto_wrap_policy": "SIZE_BASED_WRAP", "min_num_params": 100}, {}),
    ({"auto_wrap_policy": "size_based_wrap"}, {}),
    ({"fsdp_version": 2, "activation_checkpointing": True, "activation_checkpointing_offload": True}, {}),
    ({"fsdp_version": 2, "cpu_ram_efficient_loading": True}, {}),
    ({}, {"FSDP_VERSION": "2", "FSDP_RESHARD_AFTER_FORWARD": "false", "FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT",
          "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP", "FSDP_TRANSFORMER_CLS_TO_WRAP": "Block",
          "FSDP_OFFLOAD_PARAMS": "true", "FSDP_ACTIVATION_CHECKPOINTING": "true"}),
    ({}, {"FSDP_SHARDING_STRATEGY": "SHARD_GRAD_OP", "FSDP_BACKWARD_PREFETCH": "BACKWARD_PRE", "FSDP_USE_ORIG_PARAMS": "true",
          "FSDP_FORWARD_PREFETCH": "true", "FSDP_AUTO_WRAP_POLICY": "SIZE_BASED_WRAP", "FSDP_MIN_NUM_PARAMS": "50",
          "FSDP_IGNORED_MODULES": "head"}),
]


@pytest.mark.parametrize(("kwargs", "env"), PLUGIN_CASES, ids=[f"case{i}" for i in range(len(PLUGIN_CASES))])
def test_plugin_fields_equal_hf(kwargs: dict, env: dict) -> None:
    assert _fields(_build(RefPlugin, kwargs, env)) == _fields(_build(HFPlugin, kwargs, env))


REFUSED = [
    {"fsdp_version": 2, "sharding_strategy": "FULL_SHARD"},
    {"reshard_after_forward": True},
    {"fsdp_version": 2, "forward_prefetch": True},
    {"activation_checkpointing_offload": True},
    {"activation_checkpointing": True, "activation_checkpointing_offload": True},
    {"fsdp_version": 2, "state_dict_type": "LOCAL_STATE_DICT"},
    {"auto_wrap_policy": "layer_wrap"},
    {"auto_wrap_policy": "size_based_wrap", "min_num_params": "5"},
    {"mixed_precision_policy": "fp4"},
    {"mixed_precision_policy": {"param_dtype": torch.float16, "reduce_dtype": torch.float16}},
    {"cpu_offload": "yes"},
    {"fsdp_version": 2, "cpu_offload": "CPUOffload"},
]


@pytest.mark.parametrize("kwargs", REFUSED, ids=[f"refused{i}" for i in range(len(REFUSED))])
def test_plugin_refuses_what_hf_refuses(kwargs: dict) -> None:
    if kwargs.get("cpu_offload") == "CPUOffload":
        from torch.distributed.fsdp import CPUOffload

        kwargs = {**kwargs, "cpu_offload": CPUOffload()}
    for plugin_class in (HFPlugin, RefPlugin):
        with pytest.raises(ValueError):
            _build(plugin_class, kwargs, {})


@pytest.mark.parametrize("field", ["sharding_strategy", "backward_prefetch", "state_dict_type"])
def test_unknown_names_are_key_errors_naming_the_field(field: str) -> None:
    """HF lets torch's KeyError escape for an unknown enum name; accelerate_ref's KeyError also names the field
    (catalog plugin.unavailable_engines)."""
    with pytest.raises(KeyError, match="HALF"):
        _build(HFPlugin, {field: "HALF"}, {})
    with pytest.raises(KeyError, match=f"{field} HALF is not one of"):
        _build(RefPlugin, {field: "HALF"}, {})


def test_sync_module_states_materialises_meta_modules_on_this_machine() -> None:
    """HF refuses ``sync_module_states`` on a machine without an accelerator; accelerate_ref's ``param_init_fn``
    materialises on the CPU, where torch's FSDP shards over gloo."""
    with pytest.raises(RuntimeError, match="no available devices"):
        _build(HFPlugin, {"sync_module_states": True}, {})
    with pytest.warns(UserWarning, match="sync_module_states"):  # FSDP1: cpu_ram_efficient_loading forces it, as HF
        plugin = _build(RefPlugin, {"cpu_ram_efficient_loading": True}, {})
    assert plugin.sync_module_states is True
    layer = torch.nn.Linear(2, 2, device="meta")
    plugin.param_init_fn(layer)
    assert layer.weight.device.type == "cpu"


def test_methods_change_the_plugin_as_hf() -> None:
    from torch.distributed.fsdp import MixedPrecision

    results = []
    for plugin_class in (HFPlugin, RefPlugin):
        plugin = _build(plugin_class, {"auto_wrap_policy": "transformer_based_wrap"}, {})
        plugin.set_auto_wrap_policy(net(0))
        plugin.set_state_dict_type("SHARDED_STATE_DICT")
        plugin.set_mixed_precision("fp16", buffer_autocast=True)
        before = _normal(plugin.mixed_precision_policy)
        plugin.set_mixed_precision(torch.bfloat16, buffer_autocast=True, override=True)
        plugin.validate_mixed_precision_policy()
        plugin.cpu_offload = True
        plugin.set_cpu_offload()
        plugin.validate_cpu_offload()
        with pytest.raises(ValueError):
            plugin.set_mixed_precision(torch.int8)
        sized = _build(plugin_class, {"auto_wrap_policy": "size_based_wrap"}, {})
        sized.set_auto_wrap_policy(net(0))  # min_num_params 0: no wrapping
        results.append((_fields(plugin), before, sized.auto_wrap_policy))
        plugin.mixed_precision_policy = MixedPrecision()
        plugin.fsdp_version = 2
        with pytest.raises(ValueError):
            plugin.validate_mixed_precision_policy()
    assert results[0] == results[1]
    assert results[1][0]["auto_wrap_policy"][2]["transformer_layer_cls"] == [repr(Block)]


def test_set_auto_wrap_policy_names_a_missing_class() -> None:
    for plugin_class in (HFPlugin, RefPlugin):
        plugin = _build(plugin_class, {"auto_wrap_policy": "transformer_based_wrap", "transformer_cls_names_to_wrap": ["Nope"]}, {})
        with pytest.raises(ValueError, match="Nope"):
            plugin.set_auto_wrap_policy(net(0))


@pytest.mark.parametrize("kwargs", [
    {"auto_wrap_policy": "transformer_based_wrap"},
    {"auto_wrap_policy": "size_based_wrap", "min_num_params": 50},
    {"auto_wrap_policy": "no_wrap"},
])
def test_fsdp2_prepare_auto_wrap_policy_as_hf(kwargs: dict) -> None:
    model = net(0)
    picked = []
    for plugin_class, module in ((HFPlugin, hf_fsdp), (RefPlugin, ref_fsdp)):
        policy = module.fsdp2_prepare_auto_wrap_policy(_build(plugin_class, {"fsdp_version": 2, **kwargs}, {}), model)
        picked.append(None if policy is None else [name for name, sub in model.named_modules() if policy(sub)])
    assert picked[0] == picked[1]


def test_wrap_targets_follow_fsdp1_and_fsdp2_rules() -> None:
    """FSDP1's size policy counts the parameters a wrapped child does not already hold; HF's FSDP2 rule counts all."""
    sized = {"auto_wrap_policy": "size_based_wrap", "min_num_params": 50}
    assert ref_fsdp.wrap_targets(net(0), _build(RefPlugin, sized, {})) == ["blocks.0.linear", "blocks.1.linear"]
    ignoring = {**sized, "min_num_params": 5, "ignored_modules": r"blocks\.0.*"}  # FSDP1 wraps no ignored module
    assert ref_fsdp.wrap_targets(net(0), _build(RefPlugin, ignoring, {})) == ["blocks.1.linear", "head"]
    assert ref_fsdp.wrap_targets(net(0), _build(RefPlugin, {**sized, "fsdp_version": 2}, {})) == [
        "blocks.0.linear", "blocks.0", "blocks.1.linear", "blocks.1", "blocks",
    ]


def test_name_and_parameter_helpers_as_hf() -> None:
    names = {"_orig_mod.a._checkpoint_wrapped_module.w": 1, "b._orig_mod.c": 2, "d": 3}
    assert ref_fsdp.fsdp2_canonicalize_names(names) == hf_fsdp.fsdp2_canonicalize_names(names)
    model = net(0)
    for modules in (r"blocks\.\d", [model.head], None):
        ours = {id(p) for p in ref_fsdp.get_parameters_from_modules(modules, model, "cpu")}
        assert ours == {id(p) for p in hf_fsdp.get_parameters_from_modules(modules, model, "cpu")}
    scalers = [module.get_fsdp2_grad_scaler(device="cpu", init_scale=4.0) for module in (hf_fsdp, ref_fsdp)]
    assert type(scalers[0]) is type(scalers[1]) and scalers[0].get_scale() == scalers[1].get_scale() == 4.0


def test_ram_efficient_loading_switches_as_hf() -> None:
    seen = []
    for module in (hf_fsdp, ref_fsdp):
        with mock.patch.dict(os.environ, {}, clear=True):
            module.enable_fsdp_ram_efficient_loading()
            enabled = dict(os.environ)
            module.disable_fsdp_ram_efficient_loading()
            seen.append((enabled, dict(os.environ)))
    assert seen[0] == seen[1]
    assert seen[1][0] == {"ACCELERATE_USE_FSDP": "True", "FSDP_CPU_RAM_EFFICIENT_LOADING": "True"}


class _Tied(torch.nn.Module):
    _tied_weights_keys = ["head.weight"]

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(4, 8, device="meta")
        self.head = torch.nn.Linear(8, 4, bias=False, device="meta")
        self.head.weight = self.embed.weight


def test_ensure_weights_retied_as_hf() -> None:
    def to_empty(module):
        return module.to_empty(device="cpu", recurse=False)

    tied = []
    for module in (hf_fsdp, ref_fsdp):
        model = _Tied()
        init = module.ensure_weights_retied(to_empty, model, "cpu")
        for sub in (model.embed, model.head):
            init(sub)
        tied.append((model.head.weight is model.embed.weight, model.head.weight.device.type))
        assert module.ensure_weights_retied(to_empty, net(0), "cpu") is to_empty  # nothing tied: unchanged
    assert tied[0] == tied[1] == (True, "cpu")


def test_switch_optimizer_parameters_as_hf() -> None:
    for module in (hf_fsdp, ref_fsdp):
        old = [torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))]
        new = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))]
        optimizer = torch.optim.SGD(old, lr=0.1)
        module.fsdp2_switch_optimizer_parameters(optimizer, {o.data_ptr: n for o, n in zip(old, new)})
        assert all(a is b for a, b in zip(optimizer.param_groups[0]["params"], new))
        with pytest.raises(KeyError):
            module.fsdp2_switch_optimizer_parameters(torch.optim.SGD(old, lr=0.1), {})


def test_is_fsdp2_without_sharding_is_false(fresh_accelerate_state) -> None:
    import accelerate_ref

    accelerator = accelerate_ref.Accelerator(fsdp_plugin=_build(RefPlugin, {"fsdp_version": 2}, {}))
    assert accelerator.state.fsdp_plugin.fsdp_version == 2
    assert accelerator.is_fsdp2 is accelerator.state.is_fsdp2 is False  # one process: nothing is sharded


@pytest.fixture(scope="module")
def world2(tmp_path_factory) -> list[dict]:
    folder = tmp_path_factory.mktemp("fsdp_parity")
    return simulators.run(fsdp_rank_functions.all_checks, world=2, args=(str(folder),), timeout=300)


def test_world2_start_states(world2: list[dict]) -> None:
    for report in world2:
        start = report["synced_start"]
        assert start["fsdp1_sync"] == {"from_rank0": True, "is_fsdp2": False}
        assert start["fsdp2_ram_efficient"] == {"from_rank0": True, "is_fsdp2": True}
    # without either, each rank shards its own weights: the gathered model is rank 0's in part only
    assert [r["synced_start"]["fsdp1_plain"]["from_rank0"] for r in world2] == [False, False]


def test_world2_fields_shape_the_sharded_model(world2: list[dict]) -> None:
    for report in world2:
        layout = report["unit_layout"]
        assert layout["units"] == ["blocks.0", "blocks.1"]
        assert (layout["head_sharded"], layout["block_sharded"]) == (False, True)  # ignored_modules="head"
        assert layout["prefetch"] == {"forward": [True], "backward": [True]}
        assert layout["checkpointed"] == ["blocks.0._checkpoint_wrapped_module", "blocks.1._checkpoint_wrapped_module"]
        assert layout["offloaded"] == ["blocks.0", "blocks.1"]
        assert layout["after_ac"] == layout["without_ac"]  # checkpointing recomputes; it does not change the step
        assert layout["fsdp1_checkpointed"] == ["blocks.0", "blocks.1"]
        assert layout["fsdp1_after_ac"] == layout["without_ac"]


def test_world2_save_load_roundtrips_and_reads_hf_checkpoints(world2: list[dict]) -> None:
    files = {
        "FULL_STATE_DICT-v1-dcp": ["optimizer.bin", "pytorch_model_fsdp.bin"],
        "SHARDED_STATE_DICT-v1-dcp": ["optimizer_0", "pytorch_model_fsdp_0"],
        "SHARDED_STATE_DICT-v1-files": ["optimizer_0_rank0.bin", "optimizer_0_rank1.bin",
                                        "pytorch_model_fsdp_0_rank0.bin", "pytorch_model_fsdp_0_rank1.bin"],
        "LOCAL_STATE_DICT-v1-dcp": ["optimizer_0", "pytorch_model_fsdp_rank0.bin", "pytorch_model_fsdp_rank1.bin"],
        "FULL_STATE_DICT-v2-dcp": ["optimizer.bin", "pytorch_model_fsdp.bin"],
        "SHARDED_STATE_DICT-v2-dcp": ["optimizer_0", "pytorch_model_fsdp_0"],
    }
    for report in world2:
        for label, result in report["roundtrips"].items():
            assert result["restored"], label
            assert result["files"] == files[label], label
            if "-v2-" in label:
                assert result["cross"] == {"hf_reads_ref": True, "ref_reads_hf": True}, label


def test_world2_load_full_state_dict_as_hf(world2: list[dict]) -> None:
    for report in world2:
        loaded = report["load_full_state_dict"]
        assert loaded["ref"] == loaded["hf"] == loaded["expected"]


@pytest.mark.parametrize(("argument", "env"), [("bf16", {}), (None, {"ACCELERATE_MIXED_PRECISION": "fp16"})])
def test_accelerator_mixed_precision_sets_the_policy_as_hf(fresh_accelerate_state, argument, env) -> None:
    """HF's AcceleratorState gives an FSDP plugin its mixed precision (argument or environment) unless it has one."""
    import accelerate_ref

    hf_plugin = _build(HFPlugin, {}, {})
    hf_plugin.set_mixed_precision(argument or env["ACCELERATE_MIXED_PRECISION"])
    with mock.patch.dict(os.environ, env):
        accelerator = accelerate_ref.Accelerator(mixed_precision=argument, fsdp_plugin=_build(RefPlugin, {}, {}))
    assert _normal(accelerator.state.fsdp_plugin.mixed_precision_policy) == _normal(hf_plugin.mixed_precision_policy)
    assert accelerator.state.fsdp_plugin.mixed_precision_policy is not None


def test_world2_fsdp2_on_a_transformers_shaped_model(world2: list[dict]) -> None:
    runs = [report["tied_language_model"] for report in world2]
    for run in runs:
        for found in run.values():
            assert found["units"] == ["", "lm_head", "model.embed_tokens", "model.layers.0", "model.layers.1", "model.norm"]
            assert (found["tied"], found["scale"]) == (True, 2.0)
    losses = {found["loss"] for run in runs for found in run.values()}
    assert len(losses) == 1, f"rank 0's weights reach every rank with cpu_ram_efficient_loading: {losses}"
