"""Functions `tests/accelerate_ref/utils/test_fsdp_utils.py` runs on every rank of a simulated world (gloo on the CPU).

Each returns plain values the driver compares; the FSDP engine is torch's
``fully_shard`` driven by `FullyShardedDataParallelPlugin`'s fields, and HF
accelerate 1.15's FSDP helpers run beside accelerate_ref's on the same models.
"""

from __future__ import annotations

import os
from typing import Any

import torch

WIDTH = 8


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


class Net(torch.nn.Module):
    _no_split_modules = ["Block"]

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(WIDTH, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def net(seed: int) -> Net:
    torch.manual_seed(seed)
    return Net()


def _fresh(**plugin_fields: Any) -> Any:
    from accelerate_ref import Accelerator, AcceleratorState, GradientState
    from accelerate_ref.utils import FullyShardedDataParallelPlugin

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    mixed_precision = plugin_fields.pop("mixed_precision", None)
    return Accelerator(mixed_precision=mixed_precision, fsdp_plugin=FullyShardedDataParallelPlugin(**plugin_fields))


def _full(model: torch.nn.Module) -> dict[str, list[float]]:
    from accelerate_ref.utils.fsdp_utils import full_state_dict

    return {key: value.float().reshape(-1).tolist() for key, value in full_state_dict(model).items()}


def _train_step(acc: Any, model: Any, optimizer: Any) -> None:
    x = torch.randn(4, WIDTH, generator=torch.Generator().manual_seed(acc.process_index))
    acc.backward(model(x).pow(2).mean())
    optimizer.step()
    optimizer.zero_grad()


def synced_start(_: str) -> dict:
    """Ranks start from different weights; FSDP1's sync_module_states and FSDP2's cpu_ram_efficient_loading give
    every rank rank 0's (the plain FULL_SHARD plugin keeps each rank's own)."""
    rank = int(os.environ["RANK"])
    found = {}
    for label, fields in {
        "fsdp1_sync": {"sync_module_states": True},
        "fsdp2_ram_efficient": {"fsdp_version": 2, "cpu_ram_efficient_loading": True},
        "fsdp1_plain": {},
    }.items():
        acc = _fresh(**fields)
        model = acc.prepare(net(seed=rank))
        found[label] = {"from_rank0": _full(model) == _full_reference(0), "is_fsdp2": acc.is_fsdp2}
        os.environ.pop("FSDP_CPU_RAM_EFFICIENT_LOADING", None)  # the plugin sets it for transformers
    return found


def _full_reference(seed: int) -> dict[str, list[float]]:
    return {key: value.float().reshape(-1).tolist() for key, value in net(seed).state_dict().items()}


def unit_layout(_: str) -> dict:
    """What the plugin's fields do to the sharded model: wrap units, ignored modules, prefetching, checkpointing."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper, OffloadWrapper
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    acc = _fresh(auto_wrap_policy="transformer_based_wrap", ignored_modules="head", forward_prefetch=True, backward_prefetch="BACKWARD_PRE")
    model = acc.prepare(net(seed=0))
    first, second = model.blocks[0]._get_fsdp_state(), model.blocks[1]._get_fsdp_state()
    prefetch = {
        "forward": [state is second for state in first._states_to_forward_prefetch],
        "backward": [state is first for state in second._states_to_backward_prefetch],
    }
    layout = {
        "units": sorted(name for name, module in model.named_modules() if name and isinstance(module, FSDPModule)),
        "head_sharded": isinstance(model.head.weight, DTensor),
        "block_sharded": isinstance(model.blocks[0].linear.weight, DTensor),
        "prefetch": prefetch,
    }
    acc = _fresh(fsdp_version=2, auto_wrap_policy="transformer_based_wrap", activation_checkpointing=True, activation_checkpointing_offload=True)
    model = acc.prepare(net(seed=0))
    optimizer = acc.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    _train_step(acc, model, optimizer)
    layout["checkpointed"] = sorted(name for name, module in model.named_modules() if isinstance(module, CheckpointWrapper))
    layout["offloaded"] = sorted(name for name, module in model.named_modules() if isinstance(module, OffloadWrapper))
    layout["after_ac"] = _full(model)
    acc = _fresh(fsdp_version=2, auto_wrap_policy="transformer_based_wrap")
    model = acc.prepare(net(seed=0))
    optimizer = acc.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    _train_step(acc, model, optimizer)
    layout["without_ac"] = _full(model)
    acc = _fresh(auto_wrap_policy="transformer_based_wrap", activation_checkpointing=True)  # FSDP1: torch's own AC recursion
    model = acc.prepare(net(seed=0))
    optimizer = acc.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    _train_step(acc, model, optimizer)
    layout["fsdp1_checkpointed"] = sorted(name for name, module in model.named_modules() if isinstance(module, CheckpointWrapper))
    layout["fsdp1_after_ac"] = _full(model)
    return layout


def roundtrips(folder: str) -> dict:
    """Save model and optimizer under each state dict type (DCP or per-rank files), train on, load: the saved state
    comes back; HF 1.15's save/load functions read what accelerate_ref's wrote and the other way round."""
    from accelerate import PartialState as HFPartialState
    from accelerate.utils import fsdp_utils as hf

    from accelerate_ref.utils import fsdp_utils as ref

    HFPartialState()  # HF's functions log through accelerate's logger, which needs its state (the process group is up)

    results = {}
    variants = [
        ("FULL_STATE_DICT", 1, True),
        ("SHARDED_STATE_DICT", 1, True),
        ("SHARDED_STATE_DICT", 1, False),
        ("LOCAL_STATE_DICT", 1, True),
        ("FULL_STATE_DICT", 2, True),
        ("SHARDED_STATE_DICT", 2, True),
    ]
    for kind, version, use_dcp in variants:
        label = f"{kind}-v{version}-{'dcp' if use_dcp else 'files'}"
        acc = _fresh(state_dict_type=kind, fsdp_version=version)
        plugin = acc.state.fsdp_plugin
        model = acc.prepare(net(seed=0))
        optimizer = acc.prepare(torch.optim.Adam(model.parameters(), lr=0.01))
        _train_step(acc, model, optimizer)
        saved = (_full(model), optimizer.state_dict()["state"][0]["exp_avg"].clone())
        directory = os.path.join(folder, label)
        ref.save_fsdp_model(plugin, acc, model, directory, use_dcp=use_dcp)
        ref.save_fsdp_optimizer(plugin, acc, optimizer, model, directory, use_dcp=use_dcp)
        _train_step(acc, model, optimizer)
        ref.load_fsdp_model(plugin, acc, model, directory, use_dcp=use_dcp)
        ref.load_fsdp_optimizer(plugin, acc, optimizer, model, directory, use_dcp=use_dcp)
        restored = _full(model) == saved[0] and torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], saved[1])
        files = sorted(os.listdir(directory))
        cross = None
        if version == 2 and use_dcp:  # HF's functions drive FSDP2 models as accelerate_ref's do
            _train_step(acc, model, optimizer)
            hf.load_fsdp_model(plugin, acc, model, directory)
            hf_read = _full(model) == saved[0]
            hf.save_fsdp_model(plugin, acc, model, directory + "-hf")
            acc.wait_for_everyone()
            _train_step(acc, model, optimizer)
            ref.load_fsdp_model(plugin, acc, model, directory + "-hf")
            cross = {"hf_reads_ref": hf_read, "ref_reads_hf": _full(model) == saved[0]}
        results[label] = {"restored": restored, "files": files, "cross": cross}
    return results


def load_full_state_dict(_: str) -> dict:
    """`fsdp2_load_full_state_dict` and HF's on the same sharded model, the full state only on rank 0."""
    from accelerate.utils.fsdp_utils import fsdp2_load_full_state_dict as hf_load

    from accelerate_ref.utils.fsdp_utils import fsdp2_load_full_state_dict

    results = {}
    for label, load in (("ref", fsdp2_load_full_state_dict), ("hf", hf_load)):
        acc = _fresh(fsdp_version=2)
        model = acc.prepare(net(seed=5))
        full = net(seed=9).state_dict() if acc.is_main_process else {}
        load(acc, model, full)
        results[label] = _full(model)
    results["expected"] = _full_reference(9)
    return results


class _Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


class _Base(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(16, WIDTH)
        self.layers = torch.nn.ModuleList([_Layer(), _Layer()])
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.register_buffer("scale", torch.tensor(2.0), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x) * self.scale


class TiedLM(torch.nn.Module):
    """The shape of a transformers causal LM: tied embeddings, a final norm, a non-persistent buffer."""

    _no_split_modules = ["_Layer"]
    base_model_prefix = "model"
    _tied_weights_keys = ["lm_head.weight"]

    def __init__(self) -> None:
        super().__init__()
        self.model = _Base()
        self.lm_head = torch.nn.Linear(WIDTH, 16, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        self.lm_head.weight = self.model.embed_tokens.weight

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.lm_head

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model(ids))


def tied_language_model(_: str) -> dict:
    """FSDP2 on a transformers-shaped model (bf16): HF's embedding and tail units; with cpu_ram_efficient_loading
    (rank 1 starting from other weights) the tie, the non-persistent buffer and rank 0's weights survive."""
    from torch.distributed.fsdp import FSDPModule

    found = {}
    for ram_efficient in (False, True):
        torch.manual_seed(int(os.environ["RANK"]) if ram_efficient else 0)
        model = TiedLM()
        acc = _fresh(fsdp_version=2, auto_wrap_policy="transformer_based_wrap", cpu_ram_efficient_loading=ram_efficient, mixed_precision="bf16")
        os.environ.pop("FSDP_CPU_RAM_EFFICIENT_LOADING", None)
        model = acc.prepare(model)
        optimizer = acc.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
        ids = torch.randint(0, 16, (2, 6), generator=torch.Generator().manual_seed(0))
        with acc.autocast():
            loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1).float(), ids.flatten())
        acc.backward(loss)
        optimizer.step()
        found[str(ram_efficient)] = {
            "loss": loss.item(),
            "units": sorted(name for name, module in model.named_modules() if isinstance(module, FSDPModule)),
            "tied": model.lm_head.weight is model.model.embed_tokens.weight,
            "scale": model.model.scale.item(),
        }
    return found


def all_checks(folder: str) -> dict:
    """Every check above in one launch (each rank starts torch and a process group once)."""
    return {
        "synced_start": synced_start(folder),
        "unit_layout": unit_layout(folder),
        "roundtrips": roundtrips(folder),
        "load_full_state_dict": load_full_state_dict(folder),
        "tied_language_model": tied_language_model(folder),
    }
