"""`DataLoaderAdapter`: the base of the prepared loaders, and their backing by torchdata's `StatefulDataLoader`.

As HF accelerate 1.15's, a prepared loader wraps the loader it draws from,
its ``base_dataloader``: a `DataLoader` over the same dataset and batching,
or, with ``use_stateful_dataloader`` (`DataLoaderConfiguration`,
`prepare_data_loader`), torchdata's `StatefulDataLoader`, whose state it keeps.

What a prepared loader is, to ``isinstance`` and to attribute access (HF 1.15's,
measured side by side in tests/test_switching_behaviour.py and by the differential probes):

* its class is no `DataLoader` subclass (``type(loader).__mro__`` holds the
  adapter and its mixins only), but its ``__class__`` is its base loader's:
  `DataLoader`, or `StatefulDataLoader`; so it is an instance of those, while
  ``type()`` stays its own class (it pickles and copies as that class);
* an attribute it lacks is its base loader's, otherwise an AttributeError
  naming the base's class (``'DataLoader' object has no attribute 'x'``);
* ``base_dataloader`` is an attribute of instances only: on the class it is
  an AttributeError (``type object 'DataLoaderShard' has no attribute ...``);
* the adapter alone is not iterable (a TypeError); its subclasses are.

Rules of the state (HF 1.15's, measured side by side in tests/accelerate_ref/test_data_loader_stateful.py):

* ``use_stateful_dataloader`` without torchdata >= 0.8 is an ImportError
  naming the package, in HF's words;
* `state_dict` is the `StatefulDataLoader`'s state as the loader last took
  it: when it was built, before each batch is drawn, and when the epoch's
  last batch is handed out (``_iterator_finished`` True); each snapshot is then
  corrected by `adjust_state_dict_for_prefetch` for the batches drawn ahead
  of the one handed out. A state taken while the user holds the k-th batch
  of an epoch counts k batches;
* `load_state_dict` hands a state to the `StatefulDataLoader`: its next
  epoch starts after the batches the state counts (a finished state: a new
  epoch). Batch order is the loader's own: a shuffling loader draws its
  order again when it resumes, from the generators as they are then (HF's
  behaviour; `Accelerator.load_state` restores them as they were saved).
  `state_dict` is unchanged until the loader takes its next snapshot;
* `Accelerator.save_state` writes the state of such a loader to
  ``dl_state_dict.bin`` (``dl_state_dict_<i>.bin`` for the i-th, i > 0) and
  `Accelerator.load_state` reads it back when the file is there
  (`checkpointing`).

Catalog: none; the catalog is silent on ``use_stateful_dataloader``, so
this is HF 1.15's behaviour (its ``resumes at the next batch``), except
where HF's own correction miscounts (`DataLoaderDispatcher` with
``split_batches``, `SkipDataLoader` over several processes: see theirs).
"""

from __future__ import annotations

import inspect
from typing import Any, Iterator, Optional

from torch.utils.data import DataLoader

from ..state import PartialState
from ..utils.dataclasses import DistributedType
from ..utils.imports import is_torchdata_stateful_dataloader_available

#: HF 1.15's words when ``use_stateful_dataloader`` is asked for without torchdata.
TORCHDATA_MISSING = "StatefulDataLoader is not available. Please install torchdata version 0.8.0 or higher to use it."

#: DataLoader arguments that prepared loaders set themselves; every other one is carried over.
_REBUILT_ARGUMENTS = frozenset({"self", "dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"})


def carried_arguments(dataloader: DataLoader) -> dict[str, Any]:
    """The user's DataLoader arguments that a rebuilt loader keeps (workers, collate_fn, pin_memory, ...)."""
    names = inspect.signature(DataLoader.__init__).parameters
    return {name: getattr(dataloader, name) for name in names if name not in _REBUILT_ARGUMENTS and hasattr(dataloader, name)}


def _stateful_dataloader(dataset: Any, batch_sampler: Any, kwargs: dict[str, Any]) -> DataLoader:
    """torchdata's `StatefulDataLoader` over ``dataset``; ImportError (HF's words) without torchdata >= 0.8."""
    if not is_torchdata_stateful_dataloader_available():
        raise ImportError(TORCHDATA_MISSING)
    from torchdata.stateful_dataloader import StatefulDataLoader

    accepted = inspect.signature(StatefulDataLoader.__init__).parameters
    # torchdata < 0.11 has no `in_order`, which torch >= 2.6's DataLoader carries (HF drops it too)
    given = {name: value for name, value in kwargs.items() if name in accepted or name != "in_order"}
    return StatefulDataLoader(dataset, batch_sampler=batch_sampler, **given)


def _unpickled(cls: type) -> Any:
    """An empty instance of ``cls``, its attributes restored by pickle."""
    return object.__new__(cls)


def uncount_prefetched(state_dict: dict[str, Any], batches: int, batch_size: Optional[int]) -> None:
    """Lower the batch counts of a `StatefulDataLoader` state by ``batches`` drawn ahead (counts at 0 stay)."""
    for key in ("_sampler_iter_yielded", "_num_yielded"):
        if state_dict.get(key, 0) > 0:
            state_dict[key] -= batches
    sampler_state = state_dict.get("_index_sampler_state")
    if isinstance(sampler_state, dict) and sampler_state.get("samples_yielded", 0) > 0:
        sampler_state["samples_yielded"] -= (batch_size or 0) * batches


class DataLoaderAdapter:
    """A wrapper of a `DataLoader` (``base_dataloader``), or of torchdata's `StatefulDataLoader` with
    ``use_stateful_dataloader``, that passes itself off as it (see the module's rules).

    The base of `DataLoaderShard`, `DataLoaderDispatcher` and `SkipDataLoader`,
    which iterate it; the adapter itself is not iterable (HF 1.15's).
    """

    def __init__(self, dataset: Any, use_stateful_dataloader: bool = False, batch_sampler: Any = None, **kwargs: Any) -> None:
        self.use_stateful_dataloader = use_stateful_dataloader
        if use_stateful_dataloader:
            self.base_dataloader = _stateful_dataloader(dataset, batch_sampler, kwargs)
        else:
            self.base_dataloader = DataLoader(dataset, batch_sampler=batch_sampler, **kwargs)
        if hasattr(self.base_dataloader, "state_dict"):
            self.dl_state_dict: dict[str, Any] = self.base_dataloader.state_dict()

    def __getattr__(self, name: str) -> Any:
        """An attribute the adapter lacks is its base loader's (an AttributeError naming the base's class)."""
        if name == "base_dataloader":  # not built yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.base_dataloader, name)

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        """The base loader's class, so that ``isinstance(loader, DataLoader)`` holds (see the module's rules)."""
        return type(self.__dict__["base_dataloader"]) if "base_dataloader" in self.__dict__ else type(self)

    def __reduce_ex__(self, protocol: Any) -> tuple:
        """Pickle as ``type(self)`` (pickle's default would take the reported ``__class__``)."""
        return _unpickled, (type(self),), self.__dict__

    def __len__(self) -> int:
        return len(self.base_dataloader)

    @property
    def _stateful(self) -> bool:
        return hasattr(self.base_dataloader, "state_dict")

    def _drawn_batches(self) -> Iterator[Any]:
        """One epoch of the base loader's batches; a stateful one's state is taken before each batch is drawn."""
        if not self._stateful:
            return iter(self.base_dataloader)
        return self._snapshotting(iter(self.base_dataloader))

    def _snapshotting(self, batches: Iterator[Any]) -> Iterator[Any]:
        while True:
            self._update_state_dict(finished=False)
            try:
                batch = next(batches)
            except StopIteration:
                return
            yield batch

    def _finish_state(self) -> None:
        """The epoch's last batch is handed out: take the state once more, marked finished (so it resumes a new epoch)."""
        if self._stateful:
            self._update_state_dict(finished=True)

    def _update_state_dict(self, finished: bool) -> None:
        """Take the `StatefulDataLoader`'s state, corrected for prefetching, marked finished or not."""
        self.dl_state_dict = self.base_dataloader.state_dict()
        self.adjust_state_dict_for_prefetch()
        self.dl_state_dict["_iterator_finished"] = finished

    def state_dict(self) -> dict[str, Any]:
        """The `StatefulDataLoader`'s state as last taken (AttributeError without ``use_stateful_dataloader``)."""
        return self.dl_state_dict

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume the next epoch from ``state_dict`` (a state of `state_dict`; AttributeError without one)."""
        self.base_dataloader.load_state_dict(state_dict)

    def adjust_state_dict_for_prefetch(self) -> None:
        """HF's default correction: when distributed, the state's counts are lowered by ``num_processes - 1``.

        Loaders that draw ahead otherwise override it (`DataLoaderShard`:
        none; `DataLoaderDispatcher`: the rest of the next step).
        """
        state = PartialState()
        if state.distributed_type != DistributedType.NO:
            uncount_prefetched(self.dl_state_dict, state.num_processes - 1, self.batch_size)


__all__ = ["DataLoaderAdapter", "TORCHDATA_MISSING", "carried_arguments", "uncount_prefetched"]
