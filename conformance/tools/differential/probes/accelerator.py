"""Probes of ``accelerate.accelerator``: the constructor and its refusals, the topology properties, process
control (print, the ``on_*`` decorators, ``split_between_processes``, ``main_process_first``), the trigger and
the collectives, at 1 and 2 ranks.

Training (``prepare``, ``backward``, accumulation, clipping, mixed precision) is in ``accelerator_training``;
saving, state dicts and the parallelism members in ``accelerator_saving``.
"""

from __future__ import annotations

import copy

import torch

from ..probe import Api, probe

AREA = "accelerator"
#: The Accelerator's read-only views of its state, read after construction.
PROPERTIES = (
    "distributed_type", "num_processes", "process_index", "local_process_index", "device", "mixed_precision",
    "use_distributed", "multi_device", "is_main_process", "is_local_main_process", "is_last_process",
    "split_batches", "dispatch_batches", "even_batches", "use_seedable_sampler", "non_blocking",
    "use_stateful_dataloader", "save_iteration", "project_dir", "logging_dir", "sync_gradients",
    "gradient_accumulation_steps", "is_fsdp2", "is_composable_parallelism_enabled", "torch_device_mesh",
    "parallelism_config", "should_save_model", "deepspeed_plugin", "optimizer_step_was_skipped", "step",
    "rng_types", "device_placement", "step_scheduler_with_optimizer", "native_amp", "scaler", "flag_tensor",
    "trackers", "log_with",
)


def _record_properties(api: Api, accelerator, prefix: str = "") -> None:
    for name in PROPERTIES:
        api.observe(f"{prefix}{name}", getattr, accelerator, name)


def _handler(api: Api, name: str, **values):
    return api.get(f"utils.dataclasses.{name}")(**values)


@probe(AREA, worlds=(1, 2), families=("cpu", "cuda"))
def properties_of_a_default_accelerator(api: Api) -> None:
    accelerator = api.accelerator()
    _record_properties(api, accelerator)
    api.observe("state", lambda: accelerator.state)
    api.observe("gradient_state", lambda: accelerator.gradient_state)
    api.observe("dataloader_config", lambda: accelerator.dataloader_config)
    api.observe("project_configuration", lambda: accelerator.project_configuration)
    for name in ("tensor_parallel_rank", "data_parallel_rank", "data_parallel_shard_rank",
                 "pipeline_parallel_rank", "context_parallel_rank"):
        api.observe(name, getattr, accelerator, name)


@probe(AREA, worlds=(2,), families=("cpu", "cuda"))
def ddp_wrapper(api: Api) -> None:
    """The DistributedDataParallel ``prepare`` wraps a model in: pinned to the process's GPU, not on the CPU."""
    accelerator = api.accelerator()
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    api.record("wrapper", type(model).__name__)
    api.record("device_ids, output_device", [getattr(model, "device_ids", None), getattr(model, "output_device", None)])
    api.record("module's device", str(next(model.parameters()).device))


@probe(AREA)
def constructor_values(api: Api) -> None:
    config = _handler(api, "DataLoaderConfiguration", split_batches=True, even_batches=False, non_blocking=True,
                      use_seedable_sampler=True, use_stateful_dataloader=False)
    accelerator = api.accelerator(device_placement=False, dataloader_config=config, rng_types=["torch"],
                                  project_dir="runs", step_scheduler_with_optimizer=False,
                                  gradient_accumulation_steps=3)
    _record_properties(api, accelerator)
    api.observe("even_batches set", setattr, accelerator, "even_batches", True)
    api.observe("even_batches after", getattr, accelerator, "even_batches")
    api.observe("the configuration's even_batches after", lambda: accelerator.dataloader_config.even_batches)
    api.observe("gradient_accumulation_steps set", setattr, accelerator, "gradient_accumulation_steps", 5)
    api.observe("gradient_accumulation_steps after", getattr, accelerator, "gradient_accumulation_steps")
    api.observe("sync_gradients set", setattr, accelerator, "sync_gradients", False)
    api.observe("sync_gradients after", getattr, accelerator, "sync_gradients")
    api.observe("deepcopy is the accelerator", lambda: copy.deepcopy(accelerator) is accelerator)


@probe(AREA)
def constructor_project_configuration(api: Api) -> None:
    project = _handler(api, "ProjectConfiguration", project_dir="a", logging_dir="b", iteration=4)
    accelerator = api.accelerator(project_config=project, project_dir="ignored")
    api.observe("both: project_dir", getattr, accelerator, "project_dir")
    api.observe("both: logging_dir", getattr, accelerator, "logging_dir")
    api.observe("both: save_iteration", getattr, accelerator, "save_iteration")
    api.get("state.AcceleratorState")._reset_state(True)
    empty = _handler(api, "ProjectConfiguration")
    accelerator = api.accelerator(project_config=empty, project_dir="given")
    api.observe("empty config and a dir: project_dir", getattr, accelerator, "project_dir")
    api.observe("empty config and a dir: logging_dir", getattr, accelerator, "logging_dir")


@probe(AREA, env={"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "4"})
def constructor_accumulation_steps_from_the_environment(api: Api) -> None:
    accelerator = api.accelerator()
    api.observe("gradient_accumulation_steps", getattr, accelerator, "gradient_accumulation_steps")
    api.get("state.AcceleratorState")._reset_state(True)
    plugin = _handler(api, "GradientAccumulationPlugin", num_steps=2)
    accelerator = api.accelerator(gradient_accumulation_plugin=plugin)
    api.observe("a plugin wins", getattr, accelerator, "gradient_accumulation_steps")


@probe(AREA)
def constructor_refusals(api: Api) -> None:
    reset = api.get("state.AcceleratorState")._reset_state
    attempts = {
        "unknown mixed_precision": {"mixed_precision": "fp32"},
        "upper-case mixed_precision": {"mixed_precision": "BF16"},
        "dynamo_plugin and dynamo_backend": {"dynamo_plugin": _handler(api, "TorchDynamoPlugin"),
                                             "dynamo_backend": "no"},
        "deepspeed_plugin and deepspeed_plugins": {"deepspeed_plugin": object(), "deepspeed_plugins": object()},
        "fsdp_plugin of another type": {"fsdp_plugin": "fsdp"},
        "megatron_lm_plugin of another type": {"megatron_lm_plugin": "megatron"},
        "a kwargs handler that is not one": {"kwargs_handlers": ["not a handler"]},
        "two handlers of one class": {"kwargs_handlers": [_handler(api, "GradScalerKwargs"),
                                                          _handler(api, "GradScalerKwargs", init_scale=2.0)]},
        "a plugin as a kwargs handler": {"kwargs_handlers": [_handler(api, "GradientAccumulationPlugin")]},
        "both accumulation arguments": {"gradient_accumulation_steps": 2,
                                        "gradient_accumulation_plugin": _handler(api, "GradientAccumulationPlugin")},
        "an unknown keyword": {"no_such_keyword": 1},
        "fp8 without a backend": {"mixed_precision": "fp8"},
    }
    for label, kwargs in attempts.items():
        reset(True)
        api.observe(label, api.accelerator, **kwargs)


@probe(AREA)
def constructor_warnings(api: Api) -> None:
    reset = api.get("state.AcceleratorState")._reset_state
    accelerator = api.observe("torch_tp_plugin", api.accelerator,
                              torch_tp_plugin=_handler(api, "TorchTensorParallelPlugin"))
    if accelerator is not None:
        api.observe("torch_tp_plugin: parallelism_config", getattr, accelerator, "parallelism_config")
    reset(True)
    api.observe("log_with an unknown tracker", api.accelerator, log_with="no_such_tracker")
    reset(True)
    api.observe("dynamo_backend no", lambda: api.accelerator(dynamo_backend="no").state.dynamo_plugin)


@probe(AREA)
def constructor_with_a_backend_on_one_process(api: Api) -> None:
    handler = _handler(api, "InitProcessGroupKwargs", backend="gloo")
    api.observe("InitProcessGroupKwargs(backend='gloo')", lambda: api.accelerator(kwargs_handlers=[handler]).device)


@probe(AREA, families=("cpu", "cuda"))
def constructor_mixed_precision(api: Api) -> None:
    reset = api.get("state.AcceleratorState")._reset_state
    for precision in ("no", "fp16", "bf16"):
        reset(True)
        accelerator = api.observe(f"{precision}", api.accelerator, mixed_precision=precision)
        if accelerator is not None:
            api.observe(f"{precision}: mixed_precision", getattr, accelerator, "mixed_precision")
            api.observe(f"{precision}: native_amp", getattr, accelerator, "native_amp")
            api.observe(f"{precision}: scaler", getattr, accelerator, "scaler")
    reset(True)
    scaler_kwargs = _handler(api, "GradScalerKwargs", init_scale=1024.0, growth_interval=3)
    accelerator = api.observe("fp16 with GradScalerKwargs", api.accelerator, mixed_precision="fp16",
                              kwargs_handlers=[scaler_kwargs])
    if accelerator is not None and accelerator.scaler is not None:
        api.observe("scaler scale", accelerator.scaler.get_scale)
        api.observe("scaler growth interval", accelerator.scaler.get_growth_interval)


@probe(AREA)
def constructor_a_second_accelerator(api: Api) -> None:
    first = api.accelerator(mixed_precision="bf16")
    api.observe("same precision", api.accelerator, mixed_precision="bf16")
    api.observe("another precision", api.accelerator, mixed_precision="no")
    api.observe("precision left out", lambda: api.accelerator().mixed_precision)
    api.observe("the shared state", lambda: api.accelerator().state is first.state)
    plugin = _handler(api, "GradientAccumulationPlugin", num_steps=6)
    second = api.accelerator(gradient_accumulation_plugin=plugin)
    api.observe("the first sees the second's accumulation", getattr, first, "gradient_accumulation_steps")
    api.observe("the second's", getattr, second, "gradient_accumulation_steps")


@probe(AREA)
def handlers_kept(api: Api) -> None:
    handlers = [_handler(api, "DistributedDataParallelKwargs", bucket_cap_mb=5),
                _handler(api, "GradScalerKwargs", init_scale=8.0),
                _handler(api, "InitProcessGroupKwargs"),
                _handler(api, "AutocastKwargs", enabled=False),
                _handler(api, "ProfileKwargs", record_shapes=True)]
    accelerator = api.accelerator(kwargs_handlers=handlers)
    for name in ("ddp_handler", "scaler_handler", "init_handler", "autocast_handler", "profile_handler",
                 "fp8_backend", "has_fp8_handler", "fp8_enabled"):
        api.observe(name, getattr, accelerator, name)


# -- process control ----------------------------------------------------------------------------------


def _shout(word: str) -> str:
    print(f"ran {word}")
    return word.upper()


@probe(AREA, worlds=(1, 2))
def print_and_decorators(api: Api) -> None:
    accelerator = api.accelerator()
    api.observe("print", accelerator.print, "hello", 1, sep="-")
    api.observe("on_main_process", lambda: accelerator.on_main_process(_shout)("main"))
    api.observe("on_local_main_process", lambda: accelerator.on_local_main_process(_shout)("local main"))
    api.observe("on_last_process", lambda: accelerator.on_last_process(_shout)("last"))
    api.observe("on_process(process_index=1)", lambda: accelerator.on_process(process_index=1)(_shout)("one"))
    api.observe("on_process(fn, 0)", lambda: accelerator.on_process(_shout, 0)("zero"))
    api.observe("on_local_process(local_process_index=0)",
                lambda: accelerator.on_local_process(local_process_index=0)(_shout)("local zero"))
    api.observe("on_process without an index", lambda: accelerator.on_process(_shout)("none"))
    api.observe("on_main_process without a function", accelerator.on_main_process)
    api.observe("on_process without anything", accelerator.on_process)
    decorated = accelerator.on_main_process(_shout)
    api.observe("the decorated function's name", getattr, decorated, "__name__")


@probe(AREA)
def decorators_on_the_class(api: Api) -> None:
    accelerator_class = api.get("Accelerator")
    api.accelerator()
    for name in ("on_main_process", "on_local_main_process", "on_process", "on_local_process"):
        api.observe(f"Accelerator.{name}(function)", getattr(accelerator_class, name), _shout)
    api.observe("Accelerator.on_process(function, process_index=0)", accelerator_class.on_process, _shout,
                process_index=0)


@probe(AREA, worlds=(1, 2))
def split_between_processes(api: Api) -> None:
    accelerator = api.accelerator()

    def split(inputs, **kwargs):
        with accelerator.split_between_processes(inputs, **kwargs) as share:
            return share

    api.observe("a list", split, ["A", "B", "C"])
    api.observe("a list, padded", split, ["A", "B", "C"], apply_padding=True)
    api.observe("a tuple", split, ("A", "B", "C"))
    api.observe("a tensor", split, torch.arange(5))
    api.observe("a tensor, padded", split, torch.arange(5), apply_padding=True)
    api.observe("a dict", split, {"a": [1, 2, 3], "b": torch.arange(3)})
    api.observe("a dict of unequal values", split, {"a": [1, 2, 3], "b": [1]})
    api.observe("one item", split, ["only"])
    api.observe("one item, padded", split, ["only"], apply_padding=True)
    api.observe("nothing", split, [])
    api.observe("a string", split, "abc")
    api.observe("a number", split, 7)


@probe(AREA, worlds=(1, 2))
def main_process_first_and_wait(api: Api) -> None:
    accelerator = api.accelerator()
    order = []
    with accelerator.main_process_first():
        order.append("main first block")
    with accelerator.local_main_process_first():
        order.append("local main first block")
    api.record("order", order)
    api.observe("wait_for_everyone", accelerator.wait_for_everyone)


@probe(AREA, worlds=(1, 2))
def triggers(api: Api) -> None:
    accelerator = api.accelerator()
    api.observe("check without a trigger", accelerator.check_trigger)
    if api.rank == api.world_size - 1:
        api.observe("set_trigger", accelerator.set_trigger)
    api.observe("flag after set", lambda: accelerator.flag_tensor)
    api.observe("check after set", accelerator.check_trigger)
    api.observe("flag after the check", lambda: accelerator.flag_tensor)
    api.observe("check again", accelerator.check_trigger)


# -- collectives --------------------------------------------------------------------------------------


@probe(AREA, worlds=(1, 2))
def collectives(api: Api) -> None:
    accelerator = api.accelerator()
    rank = api.rank
    api.observe("gather", accelerator.gather, torch.tensor([rank, rank + 10]))
    api.observe("gather nested", accelerator.gather, {"x": torch.tensor([float(rank)]), "y": [torch.ones(1)]})
    api.observe("gather a string", accelerator.gather, "text")
    api.observe("reduce (sum by default)", accelerator.reduce, torch.arange(2) + 1 + 2 * rank)
    api.observe("reduce mean", accelerator.reduce, torch.tensor([1.0, 3.0]) * (rank + 1), "mean")
    api.observe("reduce none", accelerator.reduce, torch.tensor([1.0, 3.0]) * (rank + 1), "none")
    api.observe("reduce an unknown reduction", accelerator.reduce, torch.tensor([1.0]), "median")
    api.observe("reduce with a scale", accelerator.reduce, torch.tensor([2.0]), "sum", 0.5)
    api.observe("pad", accelerator.pad_across_processes, torch.arange(rank + 1))
    api.observe("pad first with an index", accelerator.pad_across_processes, torch.arange(rank + 1).view(1, -1),
                dim=1, pad_index=-1, pad_first=True)
    api.observe("pad a dim out of range", accelerator.pad_across_processes, torch.arange(2), dim=3)


@probe(AREA, worlds=(1, 2))
def gather_for_metrics(api: Api) -> None:
    accelerator = api.accelerator()
    rank = api.rank
    api.observe("tensors outside a loader", accelerator.gather_for_metrics, torch.tensor([rank]))
    api.observe("objects outside a loader", accelerator.gather_for_metrics, [f"r{rank}"])
    api.observe("a tensor by gather_object", accelerator.gather_for_metrics, [torch.tensor(rank)],
                use_gather_object=True)
    loader = accelerator.prepare(torch.utils.data.DataLoader(list(range(9)), batch_size=5))
    batches = []
    for batch in loader:
        batches.append(accelerator.gather_for_metrics(batch))
        batches.append(accelerator.gather_for_metrics((batch, batch * 2)))
        batches.append(accelerator.gather_for_metrics([int(x) for x in batch]))
        batches.append(accelerator.gather_for_metrics({"b": batch}))
    api.record("gathered per batch", batches)
    iterable = accelerator.prepare(torch.utils.data.DataLoader(_Stream(5), batch_size=2))
    api.observe("an iterable loader", lambda: [accelerator.gather_for_metrics(batch) for batch in iterable])
    accelerator.dataloader_config.dispatch_batches = False  # each rank reads its shard: the length stays unknown
    sharded = accelerator.prepare(torch.utils.data.DataLoader(_Stream(5), batch_size=2))
    api.observe("an iterable loader of unknown length, not dispatched",
                lambda: [accelerator.gather_for_metrics(batch) for batch in sharded])


class _Stream(torch.utils.data.IterableDataset):
    """A dataset without a length: 0..n-1."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))
