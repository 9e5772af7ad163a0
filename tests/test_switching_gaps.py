"""Behaviour gaps found when switching scripts from accelerate 1.15 (issue 13, item 3); each failed before its fix.

Catalog: accumulate.plugin, reduce.doc_example, register_for_checkpointing, save_state.roundtrip.
"""

from __future__ import annotations

import pickle

import pytest
import torch

from accelerate_ref import Accelerator, ProjectConfiguration
from accelerate_ref.optimizer import AcceleratedOptimizer
from accelerate_ref.scheduler import AcceleratedScheduler
from accelerate_ref.utils import reduce


pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def test_project_dir_fills_the_project_config(tmp_path) -> None:
    accelerator = Accelerator(cpu=True, project_dir=str(tmp_path),
                              project_config=ProjectConfiguration(automatic_checkpoint_naming=True))
    assert accelerator.project_dir == str(tmp_path)
    assert accelerator.project_configuration.automatic_checkpoint_naming
    assert accelerator.logging_dir == str(tmp_path)


def test_prepared_optimizer_and_scheduler_pickle() -> None:
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.25)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    _, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    optimizer_copy = pickle.loads(pickle.dumps(optimizer))
    assert isinstance(optimizer_copy, AcceleratedOptimizer) and optimizer_copy.param_groups[0]["lr"] == 0.25
    assert isinstance(pickle.loads(pickle.dumps(scheduler)), AcceleratedScheduler)


def test_reduce_max_and_unknown_reduction() -> None:
    Accelerator(cpu=True)
    assert reduce(torch.tensor([1.0, 3.0]), "max").tolist() == [1.0, 3.0]
    assert reduce(torch.tensor([1.0]), "min").tolist() == [1.0]  # HF 1.15 checks no name


def test_gradient_accumulation_steps_can_be_set() -> None:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    accelerator.gradient_accumulation_steps = 4
    assert accelerator.gradient_accumulation_steps == 4 and accelerator.gradient_state.num_steps == 4


def test_register_for_checkpointing_error_is_hfs_and_names_the_index() -> None:
    accelerator = Accelerator(cpu=True)
    good = torch.nn.Linear(1, 1)
    with pytest.raises(ValueError, match=r"All `objects` must include a `state_dict` and `load_state_dict`") as error:
        accelerator.register_for_checkpointing(good, object())
    assert "Item at index 0, `object`" in str(error.value)  # HF 1.15 numbers the invalid objects among themselves


def test_changing_mixed_precision_after_initialisation_gives_hfs_message() -> None:
    Accelerator(cpu=True)
    with pytest.raises(ValueError, match=r"AcceleratorState has already been initialized and cannot be changed, "
                                         r"restart your runtime completely and pass `mixed_precision='bf16'`"):
        Accelerator(cpu=True, mixed_precision="bf16")


@pytest.mark.parametrize("env_device, expected", [("cpu:64", torch.device("cpu", 64)), ("meta", torch.device("meta"))])
def test_accelerate_torch_device_is_the_device(monkeypatch, env_device: str, expected: torch.device) -> None:
    """``ACCELERATE_TORCH_DEVICE`` is taken as given by the state and the Accelerator (HF 1.15 does)."""
    from accelerate_ref import PartialState

    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", env_device)
    assert PartialState(cpu=True).device == expected
    accelerator = Accelerator(cpu=True)
    assert accelerator.device == expected
    assert next(accelerator.prepare(torch.nn.Linear(2, 1)).parameters()).device.type == expected.type


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(7))


@pytest.mark.parametrize("impl", ["accelerate_ref", "accelerate"])
def test_prepared_loaders_expose_hfs_attributes(impl: str) -> None:
    """`base_dataloader` (a plain DataLoader of the same batches), `gradient_state`, `use_stateful_dataloader`."""
    import importlib

    data_loader = importlib.import_module(f"{impl}.data_loader")
    importlib.import_module(impl).PartialState()
    DataLoader = torch.utils.data.DataLoader
    shard = data_loader.prepare_data_loader(DataLoader(list(range(6)), batch_size=2))
    loaders = {
        "shard": (shard, [[0, 1], [2, 3], [4, 5]]),
        "dispatcher": (data_loader.prepare_data_loader(DataLoader(_Stream(), batch_size=3), dispatch_batches=True,
                                                                put_on_device=True),
                       [[0, 1, 2], [3, 4, 5], [6]]),
        "skipping": (data_loader.skip_first_batches(shard, 1), [[2, 3], [4, 5]]),
    }
    for name, (loader, batches) in loaders.items():
        base = loader.base_dataloader
        assert type(base) is DataLoader and base.dataset is loader.dataset, name
        assert [batch.tolist() for batch in base] == batches, name
        assert type(loader.gradient_state).__name__ == "GradientState" and loader.use_stateful_dataloader is False, name


@pytest.mark.parametrize("impl", ["accelerate_ref", "accelerate"])
def test_split_batches_that_do_not_divide_give_hfs_error(impl: str) -> None:
    import importlib

    data_loader = importlib.import_module(f"{impl}.data_loader")
    with pytest.raises(ValueError, match=r"To use a `DataLoader` in `split_batches` mode, the batch size \(3\) "
                                         r"needs to be a round multiple of the number of processes \(2\)"):
        data_loader.prepare_data_loader(torch.utils.data.DataLoader(range(12), batch_size=3), num_processes=2,
                                        process_index=0, split_batches=True, put_on_device=False)


@pytest.mark.parametrize("impl", ["accelerate_ref", "accelerate"])
def test_load_checkpoint_reads_a_bare_weight_map_and_logs_unused_keys(impl: str, tmp_path, caplog) -> None:
    """An index JSON that is the weight map itself loads; unused checkpoint keys are logged in HF's words."""
    import importlib
    import json

    from safetensors.torch import save_file

    modeling = importlib.import_module(f"{impl}.utils.modeling")
    source = torch.nn.Linear(2, 1)
    weights = {"weight": source.weight.detach().clone(), "bias": source.bias.detach().clone(), "stray": torch.ones(1)}
    save_file(weights, str(tmp_path / "shard-1.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({name: "shard-1.safetensors" for name in weights}))
    model = torch.nn.Linear(2, 1)
    with caplog.at_level("WARNING"):
        modeling.load_checkpoint_in_model(model, str(tmp_path / "model.safetensors.index.json"))
    assert torch.equal(model.weight, source.weight) and torch.equal(model.bias, source.bias)
    assert any("were not used when initializing Linear" in record.getMessage() and "stray" in record.getMessage()
               for record in caplog.records)


def test_v027_keywords_and_a_dataloader_config_together_are_refused() -> None:
    from accelerate_ref import DataLoaderConfiguration

    with pytest.raises(ValueError, match="dataloader_config"):
        Accelerator(cpu=True, even_batches=False, dataloader_config=DataLoaderConfiguration())


def test_v027_positional_autocast_cache_enabled() -> None:
    """v0.27's ``autocast(cache_enabled, autocast_handler)``: ``autocast(True)`` still means cache_enabled=True."""
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    outside = torch.is_autocast_cache_enabled()
    torch.set_autocast_cache_enabled(False)
    try:
        with pytest.warns(FutureWarning, match="AutocastKwargs"), accelerator.autocast(True):
            assert torch.is_autocast_cache_enabled()
    finally:
        torch.set_autocast_cache_enabled(outside)
