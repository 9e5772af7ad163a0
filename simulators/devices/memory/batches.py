"""Which batches a dry run ran, and the heaviest first (``--heaviest-batches K``).

A dry run sees only the batches of the steps it runs; when their lengths vary,
the peak comes at the longest, which may be late in the epoch. Rules (in a dry
run's ranks, :mod:`simulators.devices.memory.peaks` reports what is recorded here):

- every batch a data loader yields is recorded by its size: the elements of
  its tensors (a batch of 2 sequences of 512 tokens with their labels and
  mask: 3 x 1024), what the model will be given;
- with ``$SIMULATORS_HEAVIEST_BATCHES`` set to K, a data loader's iteration
  first reads the whole epoch's batches (collation only: the dataset and the
  collate function run, no model; the batches are held on the host), then
  yields the epoch's first batch, the K largest of the others, largest first
  (the earlier one first among equal sizes), then the rest in their order.
  The first stays first because the first optimizer step makes the
  optimizer's state, which every later step's peak holds: a heavy batch
  peaks highest from the second step on. The report names the batches that
  ran by their position in the epoch, so ``--steps 2`` with K = 1 runs the
  first batch and the heaviest, wherever it sits;
- a data loader is torch's ``DataLoader``: HF accelerate's and
  accelerate_ref's prepared loaders iterate one (their own ``__iter__`` moves
  its batches to the device and shards them), the Transformers ``Trainer``'s
  and TRL's trainers prepare theirs through accelerate.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Iterator

import torch

#: Set (to K) in a rank: each data loader yields its epoch's K heaviest batches first.
HEAVIEST_ENV = "SIMULATORS_HEAVIEST_BATCHES"


class _Record:
    """The batches this process's data loaders yielded: (position in its epoch, size), in the order they ran."""

    def __init__(self) -> None:
        self.ran: list[tuple[int, int]] = []
        #: Per reordered epoch: how many batches it read.
        self.read: list[int] = []

    def report(self) -> dict[str, Any]:
        return {"ran": [{"index": index, "size": size} for index, size in self.ran], "read": self.read,
                "heaviest": _heaviest()}


RECORD = _Record()


def size(batch: Any) -> int:
    """The elements of the tensors in ``batch`` (tensors, or tuples, lists and dicts of them)."""
    if isinstance(batch, torch.Tensor):
        return batch.numel()
    if isinstance(batch, Mapping):  # a dict, or Transformers' BatchEncoding
        return sum(size(value) for value in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(size(item) for item in batch)
    return 0


def _heaviest() -> int | None:
    text = os.environ.get(HEAVIEST_ENV, "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def order(batches: list[Any], heaviest: int) -> list[int]:
    """Positions of ``batches`` in the order they run: the first, the ``heaviest`` largest of the others, largest
    first (the earlier one first among equal sizes), then the rest in their order (see the module docstring)."""
    sizes = [size(batch) for batch in batches]
    first = [0, *sorted(range(1, len(batches)), key=lambda index: (-sizes[index], index))[:heaviest]][:len(batches)]
    chosen = set(first)
    return first + [index for index in range(len(batches)) if index not in chosen]


def _recorded(iterator: Iterator[Any]) -> Iterator[Any]:
    for index, batch in enumerate(iterator):
        RECORD.ran.append((index, size(batch)))
        yield batch


def _heaviest_first(iterator: Iterator[Any], heaviest: int) -> Iterator[Any]:
    batches = list(iterator)
    RECORD.read.append(len(batches))
    for index in order(batches, heaviest):
        RECORD.ran.append((index, size(batches[index])))
        yield batches[index]


def install() -> None:
    """Record the batches of every ``torch.utils.data.DataLoader`` iteration, heaviest first where asked."""
    iterate = torch.utils.data.DataLoader.__iter__

    def iterating(self: torch.utils.data.DataLoader) -> Iterator[Any]:
        heaviest = _heaviest()
        return _heaviest_first(iterate(self), heaviest) if heaviest else _recorded(iterate(self))

    torch.utils.data.DataLoader.__iter__ = iterating
