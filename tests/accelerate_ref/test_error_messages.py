"""Refusals in 🤗 Accelerate 1.15's words (issue 13, item 5).

Where accelerate_ref refuses the same misuse as HF, it raises the same
exception type with a message that names the same thing in the same words,
so that searches and a script's ``pytest.raises(match=...)`` keep working
after the switch. Each misuse runs against both implementations with HF's
pattern; the patterns were measured on HF 1.15.
"""

from __future__ import annotations

import importlib
import re
from types import SimpleNamespace
from typing import Callable

import pytest
import torch
from torch.utils.data import DataLoader

IMPLEMENTATIONS = ["accelerate_ref", "accelerate"]


def _load(name: str) -> SimpleNamespace:
    module = importlib.import_module(name)
    return SimpleNamespace(
        root=module,
        utils=importlib.import_module(f"{name}.utils"),
        state=importlib.import_module(f"{name}.state"),
        data_loader=importlib.import_module(f"{name}.data_loader"),
        modeling=importlib.import_module(f"{name}.utils.modeling"),
    )


def _reset(loaded: SimpleNamespace) -> None:
    loaded.state.AcceleratorState._reset_state(True)
    loaded.state.GradientState._reset_state()


@pytest.fixture(params=IMPLEMENTATIONS)
def impl(request):
    """The implementation, its process-wide state forgotten before and after the test."""
    loaded = _load(request.param)
    _reset(loaded)
    yield loaded
    _reset(loaded)


def _two_states(impl) -> None:
    impl.root.Accelerator(cpu=True)
    impl.root.Accelerator(cpu=True, mixed_precision="bf16")


def _placement(impl) -> None:
    model = torch.nn.Linear(2, 1)
    impl.root.Accelerator(cpu=True).prepare(model, torch.optim.SGD(model.parameters(), lr=1), device_placement=[True])


def _after_reset(impl) -> None:
    state = impl.root.PartialState()
    impl.state.PartialState._reset_state()
    state.num_processes  # noqa: B018 - the attribute access is the misuse


def _existing_checkpoint(impl, tmp_path) -> None:
    config = impl.utils.ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
    accelerator = impl.root.Accelerator(cpu=True, project_config=config)
    accelerator.save_state()
    accelerator.project_configuration.iteration = 0
    accelerator.save_state()


def _batch_size_passed(impl) -> None:
    @impl.utils.find_executable_batch_size(starting_batch_size=4)
    def train(batch_size):
        return batch_size

    train(3)


def _pad_text(impl) -> None:
    impl.root.PartialState()
    impl.utils.pad_across_processes("text")


#: misuse -> (exception type, HF 1.15's message as a regular expression, the misuse)
MISUSES: dict[str, tuple[type, str, Callable]] = {
    "unknown mixed precision": (ValueError, r"Unknown mixed_precision mode: fp7\. Choose between \[",
                                lambda impl, tmp: impl.root.Accelerator(cpu=True, mixed_precision="fp7")),
    "accumulation steps and plugin": (
        ValueError, r"You can only pass one of `gradient_accumulation_steps` and `gradient_accumulation_plugin`",
        lambda impl, tmp: impl.root.Accelerator(cpu=True, gradient_accumulation_steps=2,
                                                gradient_accumulation_plugin=impl.utils.GradientAccumulationPlugin(num_steps=2))),
    "dynamo backend and plugin": (
        ValueError, r"You cannot pass in both `dynamo_plugin` and `dynamo_backend`",
        lambda impl, tmp: impl.root.Accelerator(cpu=True, dynamo_backend="eager",
                                                dynamo_plugin=impl.utils.TorchDynamoPlugin(backend="eager"))),
    "a kwargs handler twice": (
        ValueError, r"You can only pass one <class '[\w.]+\.AutocastKwargs'> in `kwargs_handlers`",
        lambda impl, tmp: impl.root.Accelerator(cpu=True, kwargs_handlers=[impl.utils.AutocastKwargs()] * 2)),
    "state changed after initialisation": (
        ValueError, r"AcceleratorState has already been initialized and cannot be changed, restart your runtime "
                    r"completely and pass `mixed_precision='bf16'` to `Accelerator\(\)`",
        lambda impl, tmp: _two_states(impl)),
    "state used after a reset": (
        AttributeError, r"`PartialState` object has no attribute `num_processes`\. This happens if "
                        r"`PartialState\._reset_state\(\)` was called",
        lambda impl, tmp: _after_reset(impl)),
    "device_placement of the wrong length": (
        ValueError, r"`device_placement` should be a list with 2 elements \(the number of objects passed\)",
        lambda impl, tmp: _placement(impl)),
    "dispatch without placement": (
        ValueError, r"Using `dispatch_batches=True` requires `put_on_device=True`",
        lambda impl, tmp: impl.data_loader.prepare_data_loader(DataLoader(range(4), batch_size=2),
                                                               dispatch_batches=True, put_on_device=False)),
    "loading a missing folder": (
        ValueError, r"Tried to find \S+ but folder does not exist",
        lambda impl, tmp: impl.root.Accelerator(cpu=True).load_state(str(tmp / "missing"))),
    "an automatic checkpoint that exists": (
        ValueError, r"Checkpoint directory \S+checkpoint_0 \(0\) already exists\. Please manually override "
                    r"`self\.save_iteration`",
        lambda impl, tmp: _existing_checkpoint(impl, tmp)),
    "a batch size passed to find_executable_batch_size": (
        TypeError, r"Batch size was passed into `train` as the first argument when called",
        lambda impl, tmp: _batch_size_passed(impl)),
    "an unknown tracker": (
        ValueError, r"Unsupported logging capability: nonsense\. Choose between \[",
        lambda impl, tmp: impl.root.Accelerator(cpu=True, log_with="nonsense")),
    "a missing checkpoint for load_checkpoint_in_model": (
        ValueError, r"`checkpoint` should be the path to a file containing a whole state dict",
        lambda impl, tmp: impl.modeling.load_checkpoint_in_model(torch.nn.Linear(1, 1), str(tmp / "missing"))),
    "a non-tensor to pad": (
        TypeError, r"Unsupported types \(<class 'str'>\) passed to `_?pad_across_processes`",
        lambda impl, tmp: _pad_text(impl)),
    "an unknown profiler activity": (
        ValueError, r"Invalid profiler activity: gpu\. Must be one of",
        lambda impl, tmp: impl.utils.ProfileKwargs(activities=["gpu"]).build()),
    "a decorator used on the class": (
        ValueError, r"The `on_main_process` decorator must be called with a function on an instantiated "
                    r"`Accelerator` object",
        lambda impl, tmp: impl.root.Accelerator.on_main_process(print)),
}


@pytest.mark.parametrize("misuse", list(MISUSES))
def test_refusal_in_hfs_words(impl, misuse: str, tmp_path) -> None:
    error_type, pattern, run = MISUSES[misuse]
    with pytest.raises(error_type) as error:
        run(impl, tmp_path)
    assert re.search(pattern, str(error.value)), f"{misuse}: {error.value}"
