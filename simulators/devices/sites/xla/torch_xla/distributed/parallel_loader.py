"""``torch_xla.distributed.parallel_loader``: loaders that put batches on the XLA device.

Rules (torch-xla 2.9): iterating an `MpDeviceLoader` gives the wrapped
loader's batches with every CPU tensor moved to the device, and ends a step
(``mark_step``) every ``batches_per_execution`` batches and at the end of the
epoch. The mock moves batches on demand, without torch-xla's background
threads.
"""
from __future__ import annotations

from typing import Any, Iterator, Sequence

import torch

from torch_xla.core import xla_model as xm


class ParallelLoader:
    """Wraps ``loader``; its per-device iterators yield batches on their device."""

    def __init__(self, loader: Any, devices: Sequence[str | torch.device], batchdim: int = 0,
                 batches_per_execution: int = 1, **options: Any) -> None:
        self._loader = loader
        self._devices = [torch.device(device) for device in devices]
        self.batches_per_execution = batches_per_execution
        self._batches: Iterator[Any] | None = None

    def per_device_loader(self, device: str | torch.device) -> PerDeviceLoader:
        return PerDeviceLoader(self, torch.device(device))

    def per_device_samples(self) -> int:
        return len(self._loader) // len(self._devices)

    def next_item(self, device: torch.device) -> Any:
        """The next batch on ``device``, or None at the end."""
        if self._batches is None:
            self._batches = iter(self._loader)
        try:
            batch = next(self._batches)
        except StopIteration:
            return None
        return xm.send_cpu_data_to_device([batch], device)[0]


class PerDeviceLoader:
    """The iterator of one device: a step ends every ``batches_per_execution`` batches and at the end."""

    def __init__(self, loader: ParallelLoader, device: torch.device) -> None:
        self._loader = loader
        self._device = device
        self._mark_step_batch_count = loader.batches_per_execution - 1
        self._batches_yielded = 0

    def __iter__(self) -> PerDeviceLoader:
        return self

    def __next__(self) -> Any:
        return self.next()

    def __len__(self) -> int:
        return self._loader.per_device_samples()

    def next(self) -> Any:
        if self._mark_step_batch_count <= self._batches_yielded:
            self._batches_yielded = 0
            xm.mark_step()
        else:
            self._batches_yielded += 1
        item = self._loader.next_item(self._device)
        if item is None:
            xm.mark_step()
            raise StopIteration
        return item


class MpDeviceLoader:
    """``loader`` with batches on ``device`` (one replica per process)."""

    def __init__(self, loader: Any, device: str | torch.device, **kwargs: Any) -> None:
        self._loader = loader
        self._device = device
        self._parallel_loader_kwargs = kwargs

    def __iter__(self) -> PerDeviceLoader:
        parallel_loader = ParallelLoader(self._loader, [self._device], **self._parallel_loader_kwargs)
        return parallel_loader.per_device_loader(self._device)

    def __len__(self) -> int:
        return len(self._loader)
