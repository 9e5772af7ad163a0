"""`DataLoaderAdapter`: the base of the prepared loaders, and their backing by torchdata's `StatefulDataLoader`.

HF accelerate 1.15 wraps the user's loader in an adapter whose
``base_dataloader`` is a `DataLoader`, or, with ``use_stateful_dataloader``
(`DataLoaderConfiguration`, `prepare_data_loader`), torchdata's
`StatefulDataLoader`. accelerate_ref's prepared loaders are themselves
`DataLoader` subclasses; this adapter is their common base and, with
``use_stateful_dataloader``, draws their batches through a
`StatefulDataLoader` over the same dataset and batching (their
``base_dataloader``) whose state it keeps.

What a prepared loader is, to ``isinstance`` and to attribute access (HF 1.15's,
measured side by side in tests/test_switching_behaviour.py):

* its ``__class__`` is its base loader's: torchdata's `StatefulDataLoader`
  with ``use_stateful_dataloader``, else `DataLoader`; so it is an instance
  of `StatefulDataLoader` too (HF's `DataLoaderAdapter` does the same), while
  ``type()`` stays its own class (it pickles and copies as that class);
* an attribute it lacks is looked up on the `StatefulDataLoader`, and is
  otherwise an AttributeError naming that base class (``'DataLoader' object
  has no attribute 'x'``), as HF's, which forwards to its base loader;
* ``base_dataloader`` is an attribute of instances only: on the class it is
  an AttributeError (``type object 'DataLoaderShard' has no attribute ...``).

Rules of the state (HF 1.15's, measured side by side in tests/test_stateful_loader.py):

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

from torch.utils.data import DataLoader, IterableDataset

from .state import PartialState
from .utils.dataclasses import DistributedType
from .utils.imports import is_torchdata_stateful_dataloader_available

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


def uncount_prefetched(state_dict: dict[str, Any], batches: int, batch_size: Optional[int]) -> None:
    """Lower the batch counts of a `StatefulDataLoader` state by ``batches`` drawn ahead (counts at 0 stay)."""
    for key in ("_sampler_iter_yielded", "_num_yielded"):
        if state_dict.get(key, 0) > 0:
            state_dict[key] -= batches
    sampler_state = state_dict.get("_index_sampler_state")
    if isinstance(sampler_state, dict) and sampler_state.get("samples_yielded", 0) > 0:
        sampler_state["samples_yielded"] -= (batch_size or 0) * batches


class _InstanceProperty(property):
    """A property that the class does not have, as an attribute set in ``__init__`` (HF's ``base_dataloader``)."""

    def __get__(self, instance: Any, owner: Optional[type] = None) -> Any:
        if instance is None:
            raise AttributeError(f"type object '{owner.__name__}' has no attribute '{self.fget.__name__}'")
        return super().__get__(instance, owner)


def _unpickled(cls: type) -> Any:
    """An empty instance of ``cls``, its attributes restored by pickle."""
    return object.__new__(cls)


class DataLoaderAdapter(DataLoader):
    """A `DataLoader` that, with ``use_stateful_dataloader``, is backed by torchdata's `StatefulDataLoader`.

    The base of `DataLoaderShard`, `DataLoaderDispatcher` and
    `SkipDataLoader` (see the module's rules). Iterated itself, it yields
    its batches, keeping the state as its subclasses do.
    """

    def __init__(self, dataset: Any, use_stateful_dataloader: bool = False, batch_sampler: Any = None, **kwargs: Any) -> None:
        stateful = _stateful_dataloader(dataset, batch_sampler, kwargs) if use_stateful_dataloader else None
        super().__init__(dataset, batch_sampler=batch_sampler, **kwargs)
        self.use_stateful_dataloader = use_stateful_dataloader
        self._stateful = stateful
        if stateful is not None:
            self.dl_state_dict: dict[str, Any] = stateful.state_dict()

    @_InstanceProperty
    def base_dataloader(self) -> DataLoader:
        """The `StatefulDataLoader` behind this loader, else a plain `DataLoader` of its dataset and batching.

        The plain one has no placement or synchronisation; HF keeps such a
        loader here, this loader is itself a `DataLoader`, so it is built on request.
        """
        if self._stateful is not None:
            return self._stateful
        batching = (
            {"batch_size": self.batch_size, "drop_last": self.drop_last}
            if isinstance(self.dataset, IterableDataset)
            else {"batch_sampler": self.batch_sampler}
        )
        return DataLoader(self.dataset, **batching, **carried_arguments(self))

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        """The base loader's class, as HF's adapter reports it (see the module's rules)."""
        stateful = self.__dict__.get("_stateful")
        return DataLoader if stateful is None else type(stateful)

    def __getattr__(self, name: str) -> Any:
        """An attribute this loader lacks: the `StatefulDataLoader`'s, else HF's AttributeError naming the base class."""
        stateful = self.__dict__.get("_stateful")
        if stateful is None:
            raise AttributeError(f"'DataLoader' object has no attribute '{name}'")
        return getattr(stateful, name)

    def __reduce_ex__(self, protocol: Any) -> tuple:
        """Pickle as ``type(self)`` (pickle's default would take the reported ``__class__``)."""
        return _unpickled, (type(self),), self.__dict__

    def __iter__(self) -> Iterator[Any]:
        return self._drawn_batches()

    def _drawn_batches(self) -> Iterator[Any]:
        """One epoch of batches: `DataLoader.__iter__`, or through the `StatefulDataLoader`, snapshotting its state."""
        if self._stateful is None:
            return DataLoader.__iter__(self)
        return self._snapshotting(iter(self._stateful))

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
        if self._stateful is not None:
            self._update_state_dict(finished=True)

    def _update_state_dict(self, finished: bool) -> None:
        """Take the `StatefulDataLoader`'s state, corrected for prefetching, marked finished or not."""
        self.dl_state_dict = self._stateful.state_dict()  # type: ignore[union-attr]
        self.adjust_state_dict_for_prefetch()
        self.dl_state_dict["_iterator_finished"] = finished

    def state_dict(self) -> dict[str, Any]:
        """The `StatefulDataLoader`'s state as last taken (AttributeError without ``use_stateful_dataloader``)."""
        return self.dl_state_dict

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume the next epoch from ``state_dict`` (a state of `state_dict`)."""
        if self._stateful is None:
            raise AttributeError(f"{type(self).__name__} keeps no state without use_stateful_dataloader=True")
        self._stateful.load_state_dict(state_dict)

    def adjust_state_dict_for_prefetch(self) -> None:
        """HF's default correction: when distributed, the state's counts are lowered by ``num_processes - 1``.

        Loaders that draw ahead otherwise override it (`DataLoaderShard`:
        none; `DataLoaderDispatcher`: the rest of the next step).
        """
        state = PartialState()
        if state.distributed_type != DistributedType.NO:
            uncount_prefetched(self.dl_state_dict, state.num_processes - 1, self.batch_size)


__all__ = ["DataLoaderAdapter", "TORCHDATA_MISSING", "carried_arguments", "uncount_prefetched"]
