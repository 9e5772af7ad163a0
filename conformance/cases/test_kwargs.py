"""Catalog section "Training": the kwargs handlers that reach DDP and ``init_process_group``."""

from __future__ import annotations

import gc
from datetime import timedelta

import torch

from ..support.checks import expect_equal, expect_true

from ..support.training import (
    DISTRIBUTED_WORLDS,
    FEATURES,
    fresh_rendezvous,
    case,
    index_batches,
    sample_loss,
    sgd_of,
)


class _TwoHeads(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = torch.nn.Linear(FEATURES, 1)
        self.unused = torch.nn.Linear(FEATURES, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


@case("kwargs.ddp", worlds=DISTRIBUTED_WORLDS, imports=("torch._dynamo",))  # DDP imports it for find_unused_parameters
def kwargs_ddp(impl, world):
    """``DistributedDataParallelKwargs(find_unused_parameters=True)`` reaches the DDP wrapper.

    A model with a parameter the forward never uses trains for two steps
    (DDP without the flag refuses the second); the unused one gets no gradient.
    """
    handler = impl.DistributedDataParallelKwargs(find_unused_parameters=True)
    acc = impl.Accelerator(kwargs_handlers=[handler])
    model = _TwoHeads()
    model, optimizer = acc.prepare(model, sgd_of(model))
    expect_true(getattr(model, "find_unused_parameters", None) is True, "prepared DDP model's find_unused_parameters")
    for indices in index_batches(world, 2):
        acc.backward(sample_loss(model, indices, acc.device))
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
    unused = [p.grad for p in acc.unwrap_model(model).unused.parameters()]
    expect_true(all(g is None or not g.any() for g in unused), "the unused head should get no gradient")


@case("kwargs.init_process_group", worlds=DISTRIBUTED_WORLDS)
def kwargs_init_process_group(impl, world):
    """``InitProcessGroupKwargs(timeout=timedelta(seconds=800))`` reaches the process group's creation.

    The rank pool keeps one process group across cases, so this case first
    tears it down (every rank) for the Accelerator to create it again, on a
    fresh port (objects of earlier cases may keep the old group's store
    alive on the old one); the timeout is read back from torch's default group.
    """
    import torch.distributed as dist

    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()
    fresh_rendezvous(world)
    impl.Accelerator(kwargs_handlers=[impl.InitProcessGroupKwargs(timeout=timedelta(seconds=800))])
    expect_true(dist.is_initialized(), "the Accelerator should have created the process group")
    group = dist.distributed_c10d._get_default_group()
    timeout = group._get_backend(torch.device("cpu")).options._timeout
    expect_equal(timeout.total_seconds(), 800.0, "the default process group's timeout (seconds)")
