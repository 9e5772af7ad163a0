"""Catalog section "Training": freeing memory, seeds, ``find_executable_batch_size`` and profiling."""

from __future__ import annotations

import gc
import json
import os
import random
import weakref

import torch

from ..support.checks import expect_equal, expect_raises, expect_true

from ..support.training import (
    case,
    training_objects,
)


@case("free_memory.resets")
def free_memory_resets(impl, world):
    """``free_memory()`` drops every reference to prepared objects and resets ``step`` to 0; ``clear`` is its alias.

    Observed with weak references: once the script drops its own names too,
    the prepared model, optimizer and scheduler must be garbage.
    """
    acc = impl.Accelerator(gradient_accumulation_steps=2)
    for release in ("free_memory", "clear"):
        _released_after_steps(acc, lambda objects: getattr(acc, release)(), f"{release}()")


@case("free_memory.resets", worlds=[1, 2], level="hf-1.15")
def clear_returns_nones(impl, world):
    """HF 1.15's ``clear(*objects)`` (the documents give ``clear()`` no arguments) also returns a None for each
    object it was given, so that ``model, optimizer = accelerator.clear(model, optimizer)`` drops the script's names."""
    acc = impl.Accelerator(gradient_accumulation_steps=2)

    def clear(objects):
        returned = acc.clear(*objects)
        expect_equal(list(returned), [None] * len(objects), "what clear(model, optimizer, scheduler) returns")

    _released_after_steps(acc, clear, "clear(model, optimizer, scheduler)")


def _released_after_steps(acc, release, said: str) -> None:
    """Prepare, take 3 accumulate() steps, ``release(objects)``, drop the names: ``step`` is 0 and the prepared
    objects are garbage (seen through weak references)."""
    model, optimizer, _, scheduler = training_objects()
    objects = list(acc.prepare(model, optimizer, scheduler))
    del model, optimizer, scheduler
    for _ in range(3):
        with acc.accumulate(objects[0]):
            pass
    expect_equal(acc.step, 3, "accelerator.step after 3 accumulate() blocks")
    alive = [weakref.ref(x) for x in objects]
    release(objects)
    objects.clear()
    gc.collect()
    expect_equal(acc.step, 0, f"accelerator.step after {said}")
    kept = [name for name, ref in zip(("model", "optimizer", "scheduler"), alive) if ref() is not None]
    expect_equal(kept, [], f"prepared objects still referenced after {said} and del")


def _draws() -> list[float]:
    import numpy

    return [random.random(), float(numpy.random.rand()), torch.rand(1).item()]


@case("seed.set_seed")
def set_seed(impl, world):
    """``set_seed(s)`` makes random, numpy and torch reproducible; ``device_specific=True`` adds the process index."""
    acc = impl.Accelerator()
    impl.utils.set_seed(42)
    first = _draws()
    impl.utils.set_seed(42)
    expect_equal(_draws(), first, "draws of random, numpy and torch after set_seed(42) twice")
    impl.utils.set_seed(42, device_specific=True)
    specific = _draws()
    impl.utils.set_seed(42 + acc.process_index)
    expect_equal(specific, _draws(), "set_seed(42, device_specific=True) vs set_seed(42 + process_index)")
    return {"same": first, "specific": specific}


@set_seed.check
def _seeds_across_ranks(values, world):
    expect_equal([v["same"] for v in values], [values[0]["same"]] * world.size, "set_seed(42) draws on every rank")
    specific = [tuple(v["specific"]) for v in values]
    expect_equal(len(set(specific)), world.size, "set_seed(42, device_specific=True) should differ per rank")


OUT_OF_MEMORY = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 1099511627776 bytes."


@case("memory.find_executable_batch_size", worlds=["1"])
def find_executable_batch_size(impl, world):
    """The decorated function is retried with half the batch size after out-of-memory errors, from ``starting_batch_size``.

    The function must take the batch size first and is called without it;
    an error other than out-of-memory propagates at once.
    """
    impl.Accelerator()
    tried: list[int] = []

    @impl.utils.find_executable_batch_size(starting_batch_size=128)
    def train(batch_size, label):
        tried.append(batch_size)
        if batch_size > 16:
            raise RuntimeError(OUT_OF_MEMORY)
        return batch_size, label

    expect_equal(train("run"), (16, "run"), "what the decorated function returns once a batch size fits")
    expect_equal(tried, [128, 64, 32, 16], "batch sizes tried after out-of-memory errors")

    attempts: list[int] = []

    @impl.utils.find_executable_batch_size(starting_batch_size=8)
    def broken(batch_size):
        attempts.append(batch_size)
        raise KeyError("not a memory problem")

    expect_raises(broken, KeyError, "a non-memory error inside the decorated function")
    expect_equal(attempts, [8], "batch sizes tried when the error is not about memory")


@case("profile.context")
def profile_context(impl, world):
    """``profile()`` yields a torch profiler; ``ProfileKwargs(output_trace_dir=...)`` writes a Chrome trace (A v1.x).

    Erratum: the example passes ``Accelerator(kwarg_handler=[kwargs])``; the
    argument is ``kwargs_handlers``. A ``profile_handler`` given to
    ``profile()`` overrides the Accelerator's (the custom-handler example).
    """
    trace_dir = os.path.join(world.shared_dir, "trace")
    acc = impl.Accelerator(kwargs_handlers=[impl.ProfileKwargs(output_trace_dir=trace_dir)])
    a = torch.ones(8, 8, device=acc.device)
    with acc.profile() as prof:
        a @ a
    expect_true(isinstance(prof, torch.profiler.profile), f"profile() should yield a torch.profiler.profile, got {type(prof).__name__}")
    ops = {event.key for event in prof.key_averages()}
    expect_true("aten::mm" in ops, f"the profile should record aten::mm, recorded {sorted(ops)[:10]}")
    traces = [name for name in os.listdir(trace_dir) if name.endswith(".json")] if os.path.isdir(trace_dir) else []
    expect_true(len(traces) >= 1, f"a Chrome trace (.json) should be written in output_trace_dir, found {traces}")
    with open(os.path.join(trace_dir, traces[0]), encoding="utf-8") as trace:
        expect_true("traceEvents" in json.load(trace), "the trace file should be a Chrome trace (traceEvents)")

    ready: list[int] = []
    handler = impl.ProfileKwargs(schedule_option=dict(wait=1, warmup=1, active=1), on_trace_ready=lambda p: ready.append(1))
    with acc.profile(handler) as prof:
        for _ in range(4):
            a @ a
            prof.step()
    expect_true(len(ready) >= 1, "on_trace_ready of the ProfileKwargs given to profile() should have been called")
