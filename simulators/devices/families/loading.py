"""``torch.load`` onto a mock device: the tensors come back on the device the file or ``map_location`` names.

Rules (as ``torch.load`` on the real device):

- a storage saved from the family's device (``location`` ``"cuda:0"``, say) and no ``map_location`` comes back
  on that device; a ``map_location`` naming a device of the family (``"cuda:0"``, ``torch.device("npu", 1)``,
  ``"cuda"``: the current device) puts every tensor there; any other ``map_location`` is torch's own;
- the bytes go through host memory (a mock tensor's payload is host memory); each tensor of the file becomes
  one tensor on the device, so two tensors of the file that shared a storage (views, tied weights) become two
  (the memory books count both).

torch itself can restore a storage only on a device with a storage type of its own, which the mock's Python
backend lacks; the deserializer registered here keeps the family's storages on the host, and the load is
finished by moving the loaded tensors.
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_map_only

_pending = threading.local()


def install(device_type: str, hidden_name: str) -> None:
    """Make ``torch.load`` put ``device_type`` tensors on the mock device (see the module docstring); storages
    tagged with PrivateUse1's name in the process (``hidden_name``) count as the family's."""
    torch.serialization.register_package(0, _claims_nothing, _host_storage_for(device_type, hidden_name))
    torch.load = _onto_device(torch.load, device_type)


def _claims_nothing(storage: object) -> None:
    """Saving tags storages as torch does (the mock's tensors are saved as CPU copies)."""


def _host_storage_for(device_type: str, hidden_name: str) -> Callable[[object, str], object]:
    """A deserializer keeping the family's storages on the host, noting where each was meant to go."""

    def deserialize(storage: object, location: str) -> object:
        kind, _, index = location.partition(":")
        if kind not in (device_type, hidden_name):
            return None
        meant = getattr(_pending, "locations", None)
        if meant is not None:
            meant[storage._cdata] = f"{device_type}:{index}" if index else device_type
        return storage

    return deserialize


def _family_device(map_location: Any, device_type: str) -> torch.device | None:
    """The device of the family ``map_location`` names, if it names one."""
    if isinstance(map_location, (str, torch.device)):
        device = torch.device(map_location)
        if device.type == device_type:
            return device
    return None


def _onto_device(load: Callable[..., Any], device_type: str) -> Callable[..., Any]:
    @functools.wraps(load)
    def loading(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        _pending.locations = {}
        try:
            result = load(f, map_location, *args, **kwargs)
            locations = _pending.locations
        finally:
            _pending.locations = None
        target = _family_device(map_location, device_type)
        if target is None and not locations:
            return result
        moved: dict[int, torch.Tensor] = {}

        def move(tensor: torch.Tensor) -> torch.Tensor:
            if tensor.device.type != "cpu":
                return tensor
            where = target or locations.get(tensor.untyped_storage()._cdata)
            if where is None:
                return tensor
            if id(tensor) not in moved:
                moved[id(tensor)] = tensor.to(where)
            return moved[id(tensor)]

        return tree_map_only(torch.Tensor, move, result)

    return loading
