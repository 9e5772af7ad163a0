"""Pipeline-parallel inference: `prepare_pippy` splits a model into one stage per process.

Built on torch's own ``torch.distributed.pipelining`` (``pipeline`` traces
the model and cuts it at ``SplitPoint.BEGINNING`` of each split point,
``PipelineStage`` holds this process's piece, ``ScheduleGPipe`` runs the
micro-batches through the stages). It runs on CPU over gloo as well as on
GPUs over NCCL.

Rules (as 🤗 Accelerate 1.15's ``accelerate.inference``):

* ``split_points="auto"`` cuts the model into ``num_processes`` pieces of
  about equal size (in bytes), never inside a ``no_split_module_classes``
  module; otherwise it is the list of submodule names each new stage begins
  at (``num_processes - 1`` of them).
* ``example_args`` / ``example_kwargs`` are the inputs of ONE micro-batch
  (moved to the CPU for tracing): torch fixes the shapes passed between
  stages when it builds them, so every call must cut into micro-batches of
  that shape; ``num_chunks`` (default: the number of
  processes) is the number of micro-batches a call is cut into.
* The prepared model's ``forward`` takes the inputs on the first process
  (the others call it with no arguments, or with the same arguments, which
  are ignored); a batch whose size is not ``num_chunks`` is padded to a
  multiple of it (`pad_input_tensors`), so the output has the padded size.
  The output is on the last process only (None elsewhere), or on every
  process with ``gather_output=True`` (`copy_tensor_to_devices`).
* On one process the model is returned unsplit, its ``forward`` as it
  was (HF 1.15 tries to build a pipeline there and fails: there is no
  process group).

Where this differs from HF 1.15 (both for multi-machine worlds or
``num_chunks`` other than the number of processes): the stage index is the
global process index (HF's local one gives two stages the same index on two
machines), the first stage is the main process, and ``"auto"`` always makes
``num_processes`` stages (HF makes ``num_chunks``, more stages than
processes when ``num_chunks`` is larger).
"""

from __future__ import annotations

from types import MethodType
from typing import Any, Callable, Optional, Union

from torch import nn

from .state import PartialState
from .utils import (
    compute_module_sizes,
    copy_tensor_to_devices,
    ignorant_find_batch_size,
    infer_auto_device_map,
    is_pippy_available,
    pad_input_tensors,
    send_to_device,
)


def _units(model: nn.Module, sizes: dict[str, int], share: float, no_split: list[str]) -> list[tuple[str, int]]:
    """The model's submodules a stage boundary may fall before, in order, with their sizes in bytes
    (``sizes``: `compute_module_sizes` of ``model``).

    A child is a unit when it is a leaf, a ``no_split`` class, or no larger
    than ``share``; otherwise its own children are looked at in its place.
    """
    units: list[tuple[str, int]] = []

    def visit(prefix: str, module: nn.Module) -> None:
        for child_name, child in module.named_children():
            name = f"{prefix}{child_name}"
            children = list(child.children())
            if not children or type(child).__name__ in no_split or sizes.get(name, 0) <= share:
                units.append((name, sizes.get(name, 0)))
            else:
                visit(f"{name}.", child)

    visit("", model)
    return units


def generate_device_map(
    model: nn.Module,
    num_processes: int = 1,
    no_split_module_classes: Optional[list[str]] = None,
    max_memory: Optional[dict] = None,
) -> dict[str, Union[int, str]]:
    """Which stage (process index) each submodule of ``model`` goes to when cut into ``num_processes`` stages.

    Rules: one process, or an explicit ``max_memory``, is
    `infer_auto_device_map` (unmerged, ``clean_result=False``); otherwise
    the submodules (see `_units`) are given in order to stages
    ``0..num_processes-1``, a new stage beginning when the bytes placed so
    far pass the next ``k / num_processes`` of the whole model, and every
    stage gets at least one submodule (a ValueError when there are fewer
    submodules than stages).
    """
    if num_processes == 1 or max_memory is not None:
        return infer_auto_device_map(
            model, max_memory=max_memory, no_split_module_classes=no_split_module_classes, clean_result=False
        )
    no_split = list(no_split_module_classes or [])
    sizes = compute_module_sizes(model)
    total = sizes[""]
    units = _units(model, sizes, total / num_processes, no_split)
    if len(units) < num_processes:
        raise ValueError(
            f"the model has {len(units)} submodules to split between, fewer than the {num_processes} pipeline stages"
        )
    device_map: dict[str, Union[int, str]] = {}
    placed, stage = 0, 0
    for index, (name, size) in enumerate(units):
        units_left, stages_left = len(units) - index, num_processes - stage
        starts_next = stage + 1 < num_processes and placed >= total * (stage + 1) / num_processes
        if index > 0 and (starts_next or units_left < stages_left):
            stage += 1
        device_map[name] = stage
        placed += size
    return device_map


def find_pippy_batch_size(args: Optional[tuple], kwargs: Optional[dict]) -> Optional[int]:
    """The batch size of the first of ``args``, then of ``kwargs``' values, that has one (None if none does)."""
    for value in list(args or ()) + list((kwargs or {}).values()):
        found = ignorant_find_batch_size(value)
        if found is not None:
            return found
    return None


def build_pipeline(model: nn.Module, split_points: list[str], args: tuple, kwargs: Optional[dict], num_chunks: int) -> Any:
    """This process's stage of ``model`` cut before each of ``split_points``, in a ``ScheduleGPipe`` of ``num_chunks``.

    ``args``/``kwargs`` are one micro-batch's inputs, used to trace the model.
    """
    from torch.distributed.pipelining import ScheduleGPipe, SplitPoint, pipeline

    state = PartialState()
    pipe = pipeline(
        model, mb_args=args, mb_kwargs=kwargs, split_spec={name: SplitPoint.BEGINNING for name in split_points}
    )
    if pipe.num_stages != state.num_processes:
        raise ValueError(
            f"split points {split_points} cut the model into {pipe.num_stages} stages; "
            f"the pipeline needs one per process ({state.num_processes})"
        )
    stage = pipe.build_stage(state.process_index, device=state.device)
    return ScheduleGPipe(stage, num_chunks)


def pippy_forward(forward: Callable[..., Any], num_chunks: int, gather_output: bool, *args: Any, **kwargs: Any) -> Any:
    """Run one pipelined call: the first process feeds the inputs, the last gets the output.

    Rules: on one process ``forward(*args, **kwargs)``; on the first
    process the inputs (padded to a multiple of ``num_chunks`` when their
    batch size is not ``num_chunks``; no batch size is a ValueError) go to
    ``forward``; the others call ``forward()``. The last process returns the
    output, the others None, unless ``gather_output``: then every process
    returns the last one's output.
    """
    state = PartialState()
    if state.num_processes == 1:
        return forward(*args, **kwargs)
    output = None
    if state.is_main_process:
        batch_size = find_pippy_batch_size(args, kwargs)
        if batch_size is None:
            raise ValueError("Could not find batch size from args or kwargs")
        if batch_size != num_chunks:
            args = pad_input_tensors(args, batch_size, num_chunks)
            kwargs = pad_input_tensors(kwargs, batch_size, num_chunks)
        forward(*args, **kwargs)
    elif state.is_last_process:
        output = forward()
    else:
        forward()
    return copy_tensor_to_devices(output) if gather_output else output


def prepare_pippy(
    model: nn.Module,
    split_points: Optional[Union[str, list[str]]] = "auto",
    no_split_module_classes: Optional[list[str]] = None,
    example_args: Optional[tuple[Any]] = (),
    example_kwargs: Optional[dict[str, Any]] = None,
    num_chunks: Optional[int] = None,
    gather_output: Optional[bool] = False,
) -> nn.Module:
    """Wrap ``model`` for pipeline-parallel inference, one stage per process (see the module's rules).

    Sets ``model.forward`` to the pipelined call, and keeps
    ``model._original_forward``, ``model._original_call``,
    ``model.pippy_stage`` (the schedule) and ``model.hf_split_points``.
    Every process must call it with the same model and example inputs.
    """
    if not is_pippy_available():
        raise ImportError("Using `torch.distributed.pipelining` requires PyTorch 2.4.0 or later.")
    state = PartialState()
    example_args = send_to_device(example_args, "cpu")
    example_kwargs = send_to_device(example_kwargs, "cpu")
    num_chunks = state.num_processes if num_chunks is None else num_chunks
    if state.num_processes == 1:
        model.pippy_stage, model.hf_split_points = None, []
        return model
    if split_points == "auto":
        device_map = generate_device_map(model, state.num_processes, no_split_module_classes=no_split_module_classes)
        split_points = [next(name for name, stage in device_map.items() if stage == k) for k in range(1, state.num_processes)]
    split_points = [split_points] if isinstance(split_points, str) else list(split_points)
    schedule = build_pipeline(model, split_points, example_args, example_kwargs, num_chunks)
    model._original_forward = model.forward
    model._original_call = model.__call__
    model.pippy_stage = schedule
    model.hf_split_points = split_points

    def forward(*args: Any, **kwargs: Any) -> Any:
        return pippy_forward(schedule.step, num_chunks, gather_output, *args, **kwargs)

    # `__wrapped__` lets `extract_model_from_parallel` find the original forward, as for HF's wrapper.
    forward.__wrapped__ = MethodType(forward, model)  # type: ignore[attr-defined]
    model.forward = forward
    return model
