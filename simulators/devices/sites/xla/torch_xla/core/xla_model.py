"""``torch_xla.core.xla_model`` (``xm``): devices, steps and collectives of the mock XLA device.

Follows torch-xla 2.9's signatures and results. Rules (catalog
``xla.collectives``, ``xla.reduce_scale``, ``xla.static_shapes``):

- collectives take and return tensors on the ``xla`` device (a CPU tensor
  is refused) and run over the world's gloo group
  (:mod:`simulators.devices.families.replicas`); each joins the step graph;
- ``all_reduce(type, tensor)`` returns a new tensor, ``all_reduce(type,
  [tensors])`` reduces the list in place and returns it; ``scale``
  multiplies the result; one replica alone gets its input back (a copy for a
  tensor), unscaled, as torch-xla does;
- ``all_gather`` concatenates every replica's tensor along ``dim`` in
  ordinal order (same shape on every replica);
- ``rendezvous`` ends the step and returns every replica's payload;
  ``mesh_reduce`` pickles CPU copies through it and applies ``reduce_fn`` to
  the list;
- ``mark_step`` ends the step (see :mod:`simulators.devices.families.steps`) and runs
  the step closures;
- ``xrt_world_size`` and ``get_ordinal`` are gone from torch-xla 2.9
  (``torch_xla.runtime.world_size``/``global_ordinal`` replace them); they
  remain here only as deprecated aliases for older callers.
"""
from __future__ import annotations

import io
import sys
import warnings
from collections.abc import Mapping
from typing import Any, Callable, Sequence

import torch

from simulators.devices.families import replicas as _replicas
from simulators.devices.families import xla as _mock
from torch_xla import runtime

REDUCE_SUM = "sum"
REDUCE_MUL = "mul"
REDUCE_AND = "and"
REDUCE_OR = "or"
REDUCE_MIN = "min"
REDUCE_MAX = "max"

_step_closures: list[Callable[[], Any]] = []


# -- devices and ordinals ------------------------------------------------------


def xla_device(n: int | None = None, devkind: str | None = None) -> torch.device:
    """This replica's device, ``xla:<local ordinal>`` (``xla:<n>`` when given)."""
    return runtime.xla_device(n, devkind)


def get_xla_supported_devices(devkind: str | None = None, max_devices: int | None = None) -> list[str]:
    """The devices of this host: ``["xla:0", ..., "xla:<local devices - 1>"]``."""
    devices = [f"xla:{index}" for index in range(runtime.local_device_count())]
    return devices[:max_devices] if max_devices else devices


def get_memory_info(device: str | torch.device | None = None) -> dict[str, int]:
    """``{"bytes_used", "bytes_limit", "peak_bytes_used"}`` of ``device`` (default: this replica's).

    The mock's books (:mod:`simulators.devices.memory.books`): the live tensors' storages
    against ``SIMULATORS_DEVICE_MEMORY`` (64 GiB without it).
    """
    index = _mock.XlaTensor.index_of(device)
    _mock.XlaTensor.check_index(index)
    books = _mock.XlaTensor.memory
    free, total = books.info(index)
    return {"bytes_used": total - free, "bytes_limit": total, "peak_bytes_used": books.peak(index)}


def xla_device_hw(device: str | torch.device) -> str:
    """The hardware behind ``device``: the world's PJRT device type."""
    return runtime.device_type()


def is_xla_tensor(tensor: torch.Tensor) -> bool:
    return tensor.device.type == "xla"


def get_local_ordinal(defval: int = 0) -> int:
    return runtime.local_ordinal()


def is_master_ordinal(local: bool = True) -> bool:
    """Whether this replica is ordinal 0 of its host (``local``) or of the world."""
    return (runtime.local_ordinal() if local else runtime.global_ordinal()) == 0


def master_print(*args: Any, fd: Any = sys.stdout, local: bool = False, flush: bool = False) -> None:
    if is_master_ordinal(local=local):
        print(*args, file=fd, flush=flush)


def xrt_world_size(defval: int = 1) -> int:
    """Deprecated (removed in torch-xla 2.9): use ``torch_xla.runtime.world_size()``."""
    warnings.warn("xm.xrt_world_size() is deprecated; use torch_xla.runtime.world_size()", DeprecationWarning, stacklevel=2)
    return runtime.world_size()


def get_ordinal(defval: int = 0) -> int:
    """Deprecated (removed in torch-xla 2.9): use ``torch_xla.runtime.global_ordinal()``."""
    warnings.warn("xm.get_ordinal() is deprecated; use torch_xla.runtime.global_ordinal()", DeprecationWarning, stacklevel=2)
    return runtime.global_ordinal()


def set_replication(device: str | torch.device, devices: Sequence[str | torch.device]) -> None:
    """Declare the devices that replicate the program; ``device`` must be one of them."""
    names = [str(name) for name in devices]
    if names and str(device) not in names:
        raise RuntimeError(f"set_replication: device {device} is not among the replication devices {names}")


# -- steps -----------------------------------------------------------------------


def mark_step(wait: bool = False, reset_scope: bool = True) -> None:
    """End the step: run its graph (compiling it if its ops or shapes are new), then the step closures."""
    _mock.GRAPHS.mark_step()
    closures = list(_step_closures)
    _step_closures.clear()
    for closure in closures:
        closure()


def add_step_closure(closure: Callable[..., Any], args: tuple = (), run_async: bool = False) -> None:
    """Run ``closure(*args)`` at the end of the step."""
    _step_closures.append(lambda: closure(*args))


def wait_device_ops(devices: Sequence[str] = ()) -> None:
    """Wait for pending device work (the mock runs every op at once)."""


def unlazy(tensors: Sequence[torch.Tensor]) -> None:
    """Materialize ``tensors`` (the mock's tensors always are)."""


# -- collectives -----------------------------------------------------------------


def all_reduce(reduce_type: str, inputs: Any, scale: float = 1.0, groups: Any = None, pin_layout: bool = True) -> Any:
    """Reduce across replicas: a new tensor for a tensor, in place for a list (returned)."""
    _one_group(groups)
    single = isinstance(inputs, torch.Tensor)
    tensors = _mock.require_xla([inputs] if single else list(inputs), "xm.all_reduce")
    if runtime.world_size() == 1:
        return inputs.clone() if single else inputs
    results = [tensors[0].clone()] if single else tensors
    _record("all_reduce", results)
    payloads = [result._payload for result in results]
    _replicas.all_reduce(payloads, reduce_type)
    if scale != 1.0:
        for payload in payloads:
            payload.mul_(scale)
    return results[0] if single else inputs


def all_gather(value: Any, dim: int = 0, groups: Any = None, output: Any = None, pin_layout: bool = True) -> Any:
    """Every replica's ``value`` concatenated along ``dim`` in ordinal order (a list of tensors: each)."""
    _one_group(groups)
    if isinstance(value, torch.Tensor):
        gathered = _gather_one(value, dim)
        if output is not None:
            output.copy_(gathered)
            return output
        return gathered
    if isinstance(value, list) and all(isinstance(item, torch.Tensor) for item in value):
        gathered_list = [_gather_one(item, dim) for item in value]
        if output is not None:
            for target, gathered in zip(output, gathered_list):
                target.copy_(gathered)
            return output
        return gathered_list
    raise TypeError(f"`value` needs to be a Tensor or a list of Tensors, but given {type(value)}.")


def _gather_one(value: torch.Tensor, dim: int) -> torch.Tensor:
    tensor = _mock.require_xla([value], "xm.all_gather")[0]
    _record("all_gather", [tensor])
    parts = _replicas.all_gather(tensor._payload)
    return _mock.XlaTensor.wrap(torch.cat(parts, dim=dim), tensor.device_index)


def collective_broadcast(tensors: Sequence[torch.Tensor], root_ordinal: int = 0, groups: Any = None, pin_layout: bool = True) -> None:
    """Overwrite ``tensors`` in place with replica ``root_ordinal``'s."""
    _one_group(groups)
    checked = _mock.require_xla(list(tensors), "xm.collective_broadcast")
    _record("collective_broadcast", checked)
    for tensor in checked:
        _replicas.broadcast(tensor._payload, root_ordinal)


def reduce_gradients(optimizer: torch.optim.Optimizer, groups: Any = None, pin_layout: bool = True) -> None:
    """Average the gradients of ``optimizer``'s parameters over the replicas."""
    if runtime.world_size() > 1:
        all_reduce(REDUCE_SUM, _fetch_gradients(optimizer), scale=1.0 / runtime.world_size(), groups=groups)


def optimizer_step(optimizer: torch.optim.Optimizer, barrier: bool = False, optimizer_args: Mapping[str, Any] = {},
                   groups: Any = None, pin_layout: bool = True) -> Any:
    """Average the gradients, step the optimizer, and end the step if ``barrier``."""
    reduce_gradients(optimizer, groups=groups, pin_layout=pin_layout)
    loss = optimizer.step(**optimizer_args)
    if barrier:
        mark_step()
    return loss


def _fetch_gradients(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The gradients of ``optimizer``'s parameters (their ``.data``), in parameter order."""
    return [
        param.grad.data
        for group in optimizer.param_groups
        for param in group["params"]
        if isinstance(param, torch.Tensor) and param.grad is not None
    ]


def rendezvous(tag: str, payload: bytes = b"", replicas: Sequence[int] = ()) -> list[bytes]:
    """Wait for every replica at ``tag``; returns every replica's ``payload`` in ordinal order."""
    return xla_rendezvous(payload, list(replicas) or None, tag=tag)


def xla_rendezvous(payload: bytes = b"", ordinals: Sequence[int] | None = None, tag: str | None = None) -> list[bytes]:
    if ordinals and len(ordinals) != runtime.global_device_count():
        raise ValueError("Only global rendezvous is supported")
    if not isinstance(payload, bytes):
        raise TypeError(f"`payload` must be bytes, not {type(payload)}")
    mark_step()
    return _replicas.exchange(payload)


def mesh_reduce(tag: str, data: Any, reduce_fn: Callable[[list[Any]], Any]) -> Any:
    """``reduce_fn`` of the list of every replica's ``data`` (CPU copies, in ordinal order)."""
    buffer = io.BytesIO()
    torch.save(_maybe_convert_to_cpu(data), buffer)
    gathered = [torch.load(io.BytesIO(blob), weights_only=False) for blob in rendezvous(tag, buffer.getvalue())]
    return reduce_fn(gathered)


def _one_group(groups: Any) -> None:
    if groups and not (len(groups) == 1 and sorted(groups[0]) == list(range(runtime.world_size()))):
        raise NotImplementedError(f"simulators: XLA replica groups {groups} (only the whole world) are not mocked")


def _record(operation: str, tensors: Sequence[torch.Tensor]) -> None:
    _mock.GRAPHS.record(f"xm.{operation}", (tuple(tensor.shape) for tensor in tensors))


# -- RNG and host transfers ------------------------------------------------------


def get_rng_state(device: Any = None) -> int:
    """The XLA RNG's seed (it moves on with every random op)."""
    return _mock.RNG.seed


def set_rng_state(seed: int, device: Any = None) -> None:
    _mock.RNG.seed = int(seed)


def send_cpu_data_to_device(datas: Any, device: str | torch.device, input_sharding: Any = None) -> Any:
    """``datas`` with every CPU tensor moved to ``device`` (a lone tensor comes back in a list)."""
    if type(datas) is torch.Tensor:
        datas = [datas]
    target = torch.device(device)
    return _rewrite(datas, lambda value: value.device.type == "cpu", lambda value: value.to(target))


def _maybe_convert_to_cpu(data: Any, convert: bool = True) -> Any:
    """``data`` with every XLA tensor copied to the CPU (unchanged when not ``convert``)."""
    if not convert:
        return data
    return _rewrite(data, is_xla_tensor, lambda value: value.cpu())


def save(data: Any, file_or_path: Any, master_only: bool = True, global_master: bool = False) -> None:
    """``torch.save`` of a CPU copy of ``data``, by the master ordinal only unless not ``master_only``."""
    if not master_only or is_master_ordinal(local=not global_master):
        torch.save(_maybe_convert_to_cpu(data), file_or_path)


def _rewrite(data: Any, select: Callable[[torch.Tensor], bool], convert: Callable[[torch.Tensor], Any]) -> Any:
    """``data`` (nested lists, tuples, named tuples, dicts) with the selected tensors converted."""
    if isinstance(data, torch.Tensor):
        return convert(data) if select(data) else data
    if isinstance(data, dict):
        return type(data)((key, _rewrite(value, select, convert)) for key, value in data.items())
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(_rewrite(value, select, convert) for value in data))
    if isinstance(data, (list, tuple)):
        return type(data)(_rewrite(value, select, convert) for value in data)
    return data
