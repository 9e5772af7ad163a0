"""Probes of ``accelerate.utils.memory``: out-of-memory recognition, the batch-size back-off, releasing memory.

The CUDA family runs the cache-clearing calls where HF empties ``torch.cuda``'s cache (the mock's).
"""

from __future__ import annotations

import torch

from ..probe import Api, probe

_OOM = "CUDA out of memory. Tried to allocate 2.00 GiB"


@probe("utils.memory")
def should_reduce_batch_size(api: Api) -> None:
    check = "utils.memory.should_reduce_batch_size"
    api.call("CUDA out of memory", check, RuntimeError(_OOM))
    api.call("torch.OutOfMemoryError", check, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB"))
    api.call("MPS out of memory", check, RuntimeError("MPS backend out of memory (MPS allocated: 1 GB)"))
    api.call("cuDNN not supported", check, RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may"))
    api.call("CPU allocator", check, RuntimeError("[enforce fail] DefaultCPUAllocator: can't allocate memory: 8 GB"))
    api.call("HPU", check, RuntimeError("FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed"))
    api.call("another RuntimeError", check, RuntimeError("shape mismatch"))
    api.call("two arguments", check, RuntimeError(_OOM, "details"))
    api.call("no argument", check, RuntimeError())
    api.call("a non-text argument", check, RuntimeError(42))
    api.call("not a RuntimeError", check, ValueError(_OOM))
    api.call("not an exception", check, _OOM)


def _failing_above(limit: int, tried: list[int]):
    def train(batch_size, scale=1):
        tried.append(batch_size)
        if batch_size > limit:
            raise RuntimeError(_OOM)
        return batch_size * scale

    return train


@probe("utils.memory")
def find_executable_batch_size(api: Api) -> None:
    decorate = api.get("utils.memory.find_executable_batch_size")
    api.observe("decorate", decorate, _failing_above(100, []), starting_batch_size=128)
    tried: list[int] = []
    factory = api.observe("with arguments only", decorate, starting_batch_size=16, reduce_batch_size_fn=lambda: 3)
    if factory is not None:
        api.observe("custom reduction", factory(_failing_above(4, tried)))
        api.record("batch sizes tried with the custom reduction", list(tried))

    tried = []
    never = decorate(_failing_above(-1, tried), starting_batch_size=4, reduce_batch_size_fn=lambda: 0)
    api.observe("reaches zero", never)
    api.record("batch sizes tried until zero", list(tried))
    api.observe("starting at zero", decorate(_failing_above(10, []), starting_batch_size=0))
    api.observe("starting at a negative size", decorate(_failing_above(10, []), starting_batch_size=-2))

    def wrong_shape(batch_size):
        raise ValueError(f"batch {batch_size} does not fit the layer")

    api.observe("another error propagates", decorate(wrong_shape, starting_batch_size=8))

    def train(batch_size, model, optimizer):
        return batch_size

    api.observe("batch size passed by the caller", decorate(train, starting_batch_size=8), 8, "model", "optimizer")


@probe("utils.memory")
def find_executable_batch_size_default_backoff(api: Api) -> None:
    tried: list[int] = []
    decorated = api.call("decorate", "utils.memory.find_executable_batch_size", _failing_above(100, tried),
                         starting_batch_size=110)
    api.observe("first call", decorated, scale=2)
    api.record("batch sizes tried", list(tried))
    api.observe("second call keeps the size that worked", decorated)
    api.record("batch sizes tried after the second call", list(tried))


@probe("utils.memory", families=("cpu", "cuda"))
def release_memory(api: Api) -> None:
    device = "cuda:0" if api.family == "cuda" else "cpu"
    first, second = torch.ones(4, device=device), {"weights": torch.zeros(2, device=device)}
    api.call("two objects", "utils.memory.release_memory", first, second)
    api.call("clear the cache", "utils.memory.clear_device_cache")
