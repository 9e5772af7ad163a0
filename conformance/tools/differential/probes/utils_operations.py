"""Probes of ``accelerate.utils.operations``' collectives: results, refusals and their messages, at 1 and 2 ranks,
and debug mode's checks (``ACCELERATE_DEBUG_MODE``). The local helpers are in ``utils_operations_local``."""

from __future__ import annotations

import torch

from ..probe import Api, probe

AREA = "utils.operations"
OPS = "utils.operations"
DEBUG = {"ACCELERATE_DEBUG_MODE": "1"}


@probe(AREA, worlds=(1, 2))
def gather(api: Api) -> None:
    api.partial_state()
    api.call("a tensor", f"{OPS}.gather", torch.arange(3.0) + api.rank)
    api.call("a nested structure", f"{OPS}.gather", {"a": torch.tensor([api.rank]), "b": [torch.ones(2)]})
    api.call("a 0-d tensor", f"{OPS}.gather", torch.tensor(float(api.rank)))
    api.call("not a tensor", f"{OPS}.gather", "text")


@probe(AREA, worlds=(1, 2))
def reduce(api: Api) -> None:
    api.partial_state()
    for reduction in ("mean", "sum", "max", "min"):
        api.call(f"reduction {reduction}", f"{OPS}.reduce", torch.tensor([1.0, 3.0]) * (api.rank + 1), reduction)
    api.call("scale", f"{OPS}.reduce", torch.tensor([2.0]), "sum", 0.5)
    api.call("reduction none", f"{OPS}.reduce", torch.tensor([1.0]) * (api.rank + 1), "none")
    api.call("the default (mean)", f"{OPS}.reduce", torch.tensor([2.0, 4.0]) * (api.rank + 1))
    api.call("nested sum", f"{OPS}.reduce", {"a": [torch.tensor([api.rank])], "b": (torch.ones(2),)}, "sum")
    api.call("an integer mean", f"{OPS}.reduce", torch.tensor([2, 4]), "mean")
    api.call("an integer sum", f"{OPS}.reduce", torch.tensor([2, 4]) + api.rank, "sum")
    tensor = torch.tensor([5.0])
    api.observe("a new tensor", lambda: api.get(f"{OPS}.reduce")(tensor, "sum") is tensor)
    api.call("not a tensor", f"{OPS}.reduce", [torch.ones(1), "x"], "sum")


@probe(AREA, worlds=(1, 2))
def gather_object(api: Api) -> None:
    api.partial_state()
    call = f"{OPS}.gather_object"
    api.call("a list", call, [api.rank, {"r": api.rank}])
    api.call("a list of lists", call, [[api.rank, api.rank]])
    api.call("a tuple", call, ("t", api.rank))
    api.call("a dict", call, {"k": api.rank})
    api.call("an int", call, api.rank)
    api.call("a string", call, f"s{api.rank}")
    api.call("a tensor in a list", call, [torch.tensor([api.rank])])


@probe(AREA, worlds=(1, 2))
def broadcast(api: Api) -> None:
    api.partial_state()
    call = f"{OPS}.broadcast"
    api.call("a tensor", call, torch.arange(3.0) + api.rank)
    api.call("from process 1", call, torch.arange(2) + 10 * api.rank, from_process=api.world_size - 1)
    api.call("nested", call, {"a": [torch.tensor([api.rank])], "b": (torch.ones(1) * api.rank,)})
    tensor = torch.tensor([float(api.rank)])
    api.observe("in place", lambda: [api.get(call)(tensor) is tensor, tensor])
    strided = (torch.arange(6.0) + 10 * api.rank).view(2, 3).t()
    api.observe("a non-contiguous tensor, in place", lambda: [api.get(call)(strided) is strided, strided])
    api.call("not a tensor", call, [torch.ones(1), "x"])
    api.call("from a process that does not exist", call, torch.ones(1), from_process=5)


@probe(AREA, worlds=(1, 2))
def broadcast_object_list(api: Api) -> None:
    api.partial_state()
    call = f"{OPS}.broadcast_object_list"
    objects = [api.rank, {"r": api.rank}, "x"]
    api.observe("in place", lambda: [api.get(call)(objects) is objects, objects])
    api.call("from process 1", call, [f"from {api.rank}"], from_process=api.world_size - 1)
    api.call("from a process that does not exist", call, [api.rank], from_process=5)


@probe(AREA, worlds=(1, 2))
def pad_across_processes(api: Api) -> None:
    api.partial_state()
    call = f"{OPS}.pad_across_processes"
    api.call("the documented example", call, torch.arange(api.rank + 1))
    ragged = torch.arange(2 * (api.rank + 1), dtype=torch.float32).reshape(2, api.rank + 1)
    api.call("dim 1, pad_index, pad_first", call, ragged, dim=1, pad_index=-1, pad_first=True)
    api.call("a negative dim", call, ragged, dim=-1, pad_index=9)
    api.call("a dim out of range", call, ragged, dim=2)
    api.call("a 0-d tensor", call, torch.tensor(1.0))
    api.call("nested", call, {"a": [torch.ones(api.rank + 1)], "b": (torch.zeros(2, api.rank + 2),)})
    api.call("a bool tensor", call, torch.ones(api.rank + 1, dtype=torch.bool))
    api.call("an int tensor, a float pad_index", call, torch.ones(api.rank + 1, dtype=torch.int64), pad_index=0.5)
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged)
    api.observe("a nested tensor", lambda: api.get(call)(nested) is nested)
    api.call("not a tensor", call, {"x": torch.ones(1), "y": 1.0})


@probe(AREA)
def copy_tensor_to_devices(api: Api) -> None:
    """One process only: HF 1.15 reads the shape of the tensor the others lack from an uninitialised buffer
    (``torch.empty``), so what a process without the tensor receives is not deterministic (nor is
    ``gather_tensor_shape``, nor a call where no process holds one)."""
    api.partial_state()
    call = f"{OPS}.copy_tensor_to_devices"
    api.call("a float tensor", call, torch.arange(6, dtype=torch.float32).reshape(2, 3) + 1)
    api.call("an int tensor", call, torch.tensor([7, 8]))


@probe(AREA, worlds=(1, 2), env=DEBUG)
def debug_mode(api: Api) -> None:
    """``ACCELERATE_DEBUG_MODE=1``: the collectives check their inputs across ranks first."""
    api.partial_state()
    api.observe("debug", lambda: api.get("PartialState")().debug)
    api.call("gather, equal shapes", f"{OPS}.gather", torch.ones(2) * api.rank)
    api.call("gather, shapes differ", f"{OPS}.gather", torch.ones(api.rank + 1))
    api.call("gather, nested shapes differ", f"{OPS}.gather", {"a": [torch.ones(2, api.rank + 1)]})
    api.call("reduce, shapes differ", f"{OPS}.reduce", torch.ones(api.rank + 1), "sum")
    api.call("broadcast, shapes differ", f"{OPS}.broadcast", torch.ones(api.rank + 1))
    api.call("broadcast by keyword, shapes differ", f"{OPS}.broadcast", tensor=torch.ones(api.rank + 1))
    api.call("gather, a tensor on another device", f"{OPS}.gather", torch.ones(2, device="meta"))
    api.call("pad_across_processes, dimensions differ", f"{OPS}.pad_across_processes",
             torch.ones(*([2] * (api.rank + 1))))
    api.call("pad_across_processes, sizes differ", f"{OPS}.pad_across_processes", torch.ones(api.rank + 1))


def _scaled(tensor: torch.Tensor, factor: float = 2.0) -> torch.Tensor:
    """A user's function to decorate."""
    return tensor * factor


@probe(AREA, worlds=(1, 2), env=DEBUG)
def verify_and_chain_a_function(api: Api) -> None:
    """``verify_operation`` and ``chained_operation`` on a user's function, in debug mode."""
    api.partial_state()
    verified = api.call("verify_operation", f"{OPS}.verify_operation", _scaled)
    api.observe("its name", lambda: [verified.__name__, verified.__wrapped__ is _scaled])
    api.observe("equal shapes", verified, torch.ones(2))
    api.observe("equal shapes by keyword", verified, tensor=torch.ones(2), factor=3.0)
    api.observe("shapes differ", verified, torch.ones(api.rank + 1))
    chained = api.call("chained_operation", f"{OPS}.chained_operation", verified)
    api.observe("chained, equal shapes", chained, torch.ones(1))
    api.observe("chained, shapes differ", chained, torch.ones(api.rank + 2))
    exception = api.get(f"{OPS}.DistributedOperationException")
    api.observe("the exception", lambda: [exception.__mro__[1].__name__, exception.__doc__ is not None])


@probe(AREA, worlds=(2,), families=("cpu", "cuda"))
def collectives_on_the_device(api: Api) -> None:
    """On the mock GPUs HF takes its all_gather_into_tensor path; the results come back on the state's device."""
    state = api.partial_state()
    on_device = torch.arange(2.0, device=state.device) + api.rank
    api.call("gather", f"{OPS}.gather", on_device)
    api.call("reduce", f"{OPS}.reduce", on_device, "sum")
    api.call("broadcast", f"{OPS}.broadcast", on_device.clone(), from_process=1)
    api.call("pad_across_processes", f"{OPS}.pad_across_processes", torch.ones(api.rank + 1, device=state.device))
