"""Helpers shared by test modules that run accelerate_ref and HF accelerate side by side."""

from __future__ import annotations

import importlib
import pickle
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader, IterableDataset


def both_states():
    """A fresh accelerate_ref state and a fresh HF state, one process on CPU."""
    import accelerate.state as hf_state

    import accelerate_ref.state as ref_state

    for module in (ref_state, hf_state):
        module.AcceleratorState._reset_state(True)
        module.GradientState._reset_state()
    return ref_state, hf_state


def accelerator_state_of(module):
    """`AcceleratorState` as an `Accelerator` creates it (HF's refuses to be created bare)."""
    import importlib

    utils = importlib.import_module(module.__name__.replace(".state", ".utils"))
    return module.AcceleratorState(cpu=True, dynamo_plugin=utils.TorchDynamoPlugin(), _from_accelerator=True)


IMPLS = ("accelerate", "accelerate_ref")


RANK_ENV = {"OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1"}




def leave_together(report: dict) -> dict:
    """``report``, once every rank is done: a rank leaving (closing its connections) while another is still
    receiving its last broadcast would fail that one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
    return report


class SevenItems(IterableDataset):
    def __iter__(self):
        return iter(range(7))


#: Attributes read on every prepared loader; a missing one is compared by its AttributeError's text.
LOADER_ATTRIBUTES = ("dataset", "batch_size", "sampler", "batch_sampler", "total_batch_size", "total_dataset_length",
               "use_stateful_dataloader", "end_of_dataloader", "remainder", "drop_last", "iteration", "device",
               "split_batches", "_drop_last", "dl_state_dict", "no_such_attribute")


#: (loader, attribute) -> why accelerate_ref keeps a value where HF 1.15 raises or differs (HF's own bugs).
LOADER_DEVIATIONS = {
    ("dispatcher", "total_batch_size"): "HF reads dataset.batch_size, which a user's dataset lacks: AttributeError; "
                                        "accelerate_ref gives the documented global batch size",
    ("DataLoaderDispatcher", "total_batch_size"): "as for the dispatcher",
    ("skip(shard)", "total_batch_size"): "HF's SkipBatchSampler has no batch_size: AttributeError; accelerate_ref "
                                         "gives the documented global batch size",
    ("skip(dispatcher)", "total_batch_size"): "as for skip(shard)",
    ("skip(dispatcher)", "batch_sampler"): "HF skips batches of the user's loader, not steps (misaligned at 2 ranks); "
                                           "accelerate_ref skips steps and loads them for the padding",
    ("skip(dispatcher)", "batches"): "as for its batch_sampler (they agree at 1 rank)",
    ("stream shard", "total_batch_size"): "at 2 ranks HF gives the per-process size (its default BatchSampler's); "
                                          "accelerate_ref gives the documented global one",
}


def observation(value: Callable[[], Any]) -> Any:
    """A plain value, a type name for an object, or ``!Error: text`` for what it raises."""
    try:
        result = value()
    except Exception as error:  # the exception is the observation
        return f"!{type(error).__name__}: {error}"
    if result is None or isinstance(result, (bool, int, float, str)):
        return result
    return f"<{result.__name__}>" if isinstance(result, type) else f"<{type(result).__name__}>"


def prepared_loaders(impl: str, stateful: bool) -> dict[str, DataLoader]:
    data_loader = importlib.import_module(f"{impl}.data_loader")
    importlib.import_module(f"{impl}.state").PartialState(cpu=True)
    option = {"use_stateful_dataloader": True} if stateful else {}
    shard = data_loader.prepare_data_loader(DataLoader(list(range(10)), batch_size=2), **option)
    dispatcher = data_loader.prepare_data_loader(DataLoader(list(range(10)), batch_size=2), dispatch_batches=True,
                                                 put_on_device=True, **option)
    return {
        "shard": shard,
        "dispatcher": dispatcher,
        "stream shard": data_loader.prepare_data_loader(DataLoader(SevenItems(), batch_size=2), **option),
        "skip(shard)": data_loader.skip_first_batches(shard, 1),
        "skip(dispatcher)": data_loader.skip_first_batches(dispatcher, 1),
        "skip(stream)": data_loader.skip_first_batches(DataLoader(SevenItems(), batch_size=2), 1),
        "SkipDataLoader": data_loader.SkipDataLoader(list(range(10)), batch_size=2, skip_batches=1, **option),
        "DataLoaderShard": data_loader.DataLoaderShard(list(range(10)), batch_size=2, **option),
        "DataLoaderDispatcher": data_loader.DataLoaderDispatcher(list(range(10)), batch_size=2, **option),
    }


def loader_observations(impl: str, stateful: bool) -> dict[tuple[str, str], Any]:
    """(loader, what) -> what a user sees of ``impl``'s prepared loaders."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    data_loader = importlib.import_module(f"{impl}.data_loader")
    seen: dict[tuple[str, str], Any] = {}
    for name, loader in prepared_loaders(impl, stateful).items():
        classes = ("DataLoaderShard", "DataLoaderDispatcher", "SkipDataLoader", "DataLoaderStateMixin", "DataLoaderAdapter")
        for cls in [DataLoader, StatefulDataLoader] + [getattr(data_loader, cls) for cls in classes]:
            seen[name, f"isinstance {cls.__name__}"] = isinstance(loader, cls)
        seen[name, "type"] = type(loader).__name__
        seen[name, "__class__"] = loader.__class__.__name__
        seen[name, "class.base_dataloader"] = observation(lambda: type(loader).base_dataloader)
        for attribute in LOADER_ATTRIBUTES:
            seen[name, attribute] = observation(lambda: getattr(loader, attribute))
        seen[name, "base_dataloader"] = observation(lambda: type(loader.base_dataloader))
        seen[name, "len"] = observation(lambda: len(loader))
        seen[name, "set_epoch"] = observation(lambda: loader.set_epoch(0))
        seen[name, "pickled"] = observation(lambda: type(pickle.loads(pickle.dumps(loader))))
        seen[name, "batches"] = observation(lambda: str([batch.tolist() for batch in loader]))
    return seen


def loader_differences(hf: dict, ref: dict) -> dict:
    """Where the observations differ, deliberate deviations left out."""
    return {key: (hf[key], ref[key]) for key in hf if hf[key] != ref[key] and key not in LOADER_DEVIATIONS}


def loader_comparison() -> dict:
    """On a rank: every observation of both implementations, stateful or not."""
    return leave_together({stateful: {impl: loader_observations(impl, stateful) for impl in IMPLS}
                            for stateful in (False, True)})
