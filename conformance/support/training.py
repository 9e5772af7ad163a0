"""What the training cases share: the fixed sample table, a tiny model, one-process replays of training, and
the timeout their model cases get (`case`).

The cases of catalog section "Training" (`conformance.cases.test_training` and
its siblings) train a tiny ``nn.Linear`` on rows of `DATA` picked by index and
compare what each rank saw with `replay`, the same training in one process.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Iterable

import torch

from simulators.ports import free_port

from ..engine.case import ANY_WORLD
from ..engine.case import case as _case
from .checks import expect_equal



#: Building the first DDP model in a process loads ``torch._dynamo`` (2-6 s on
#: a busy 2-core machine), which counts against whichever model case comes
#: first; the training cases get room for it.
MODEL_CASE_TIMEOUT = 30.0


def case(catalog_id: str, **options: Any):
    """`conformance.engine.case.case` with the training cases' timeout."""
    return _case(catalog_id, **{"timeout": MODEL_CASE_TIMEOUT, **options})


DISTRIBUTED_WORLDS = tuple(w for w in ANY_WORLD if w != "1")


LR = 0.1


BATCH = 2


FEATURES = 4


#: The input table: row i is sample i (x: FEATURES values, y: one target). Enough rows for 2x4 worlds.
DATA = torch.randn(256, FEATURES + 1, generator=torch.Generator().manual_seed(1234))


def samples_at(indices: Any, device: Any = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) of the samples at ``indices`` (a tensor or list of ints), on ``device``."""
    rows = DATA[torch.as_tensor(indices).cpu().long()]
    return rows[:, :FEATURES].to(device), rows[:, FEATURES:].to(device)


def sample_loss(model: Any, indices: Any, device: Any = "cpu") -> torch.Tensor:
    x, y = samples_at(indices, device)
    return torch.nn.functional.mse_loss(model(x), y)


def tiny_linear(seed: int = 0) -> torch.nn.Linear:
    """The model every rank builds identically (the replay builds it again)."""
    torch.manual_seed(seed)
    return torch.nn.Linear(FEATURES, 1)


def weights_of(model: torch.nn.Module) -> list[float]:
    return torch.cat([p.detach().cpu().reshape(-1) for p in model.parameters()]).tolist()


def grads_of(model: torch.nn.Module) -> list[float]:
    return torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).detach().cpu().float().reshape(-1) for p in model.parameters()]
    ).tolist()


def expect_close(got: list[float], expected: list[float], what: str, tolerance: float = 1e-5) -> None:
    worst = max((abs(g - e) for g, e in zip(got, expected)), default=0.0)
    if len(got) != len(expected) or worst > tolerance * max(1.0, max(map(abs, expected), default=1.0)):
        raise AssertionError(f"{what}: expected {expected}, got {got} (largest difference {worst:.3g})")


def local_gradient(weights: list[float], indices: Iterable[int], scale: float = 1.0) -> torch.Tensor:
    """Gradient of ``scale * mse`` over ``indices`` at ``weights``, computed in this process."""
    model = tiny_linear()
    torch.nn.utils.vector_to_parameters(torch.tensor(weights), model.parameters())
    (scale * sample_loss(model, list(indices))).backward()
    return torch.nn.utils.parameters_to_vector([p.grad for p in model.parameters()])


def replay(initial: list[float], micro_steps: list[list[list[int]]], syncs: list[bool], num_steps: int) -> dict:
    """One process replaying data-parallel SGD with gradient accumulation.

    ``micro_steps[k][r]`` are the indices rank r trained on at micro-step k;
    each micro-step adds ``1/num_steps`` of rank r's local gradient to rank
    r's accumulator; where ``syncs[k]`` the update uses the mean of the
    accumulators over ranks. That is the full-batch gradient when all
    batches have the same size. Returns the expected gradient each rank
    holds after each micro-step's backward, and the final weights.
    """
    weights = torch.tensor(initial)
    ranks = len(micro_steps[0])
    accumulated = [torch.zeros_like(weights) for _ in range(ranks)]
    grads_seen = []
    for batches, sync in zip(micro_steps, syncs):
        for rank, indices in enumerate(batches):
            accumulated[rank] += local_gradient(weights.tolist(), indices, 1.0 / num_steps)
        if sync:
            mean = sum(accumulated) / ranks
            grads_seen.append([mean.tolist()] * ranks)
            weights = weights - LR * mean
            accumulated = [torch.zeros_like(weights) for _ in range(ranks)]
        else:
            grads_seen.append([g.tolist() for g in accumulated])
    return {"grads": grads_seen, "final": weights.tolist()}


def train_steps(acc: Any, model: Any, optimizer: Any, batches: Iterable[Any], accumulate: bool) -> dict:
    """The documented loop; records per micro-step indices, sync_gradients, gradients and whether weights moved."""
    record: dict[str, list] = {"indices": [], "sync": [], "grads": [], "moved": []}
    for indices in batches:
        with acc.accumulate(model) if accumulate else contextlib.nullcontext():
            before = weights_of(acc.unwrap_model(model))
            acc.backward(sample_loss(model, indices, acc.device))
            record["grads"].append(grads_of(acc.unwrap_model(model)))
            record["sync"].append(bool(acc.sync_gradients))
            optimizer.step()
            optimizer.zero_grad()
            record["moved"].append(weights_of(acc.unwrap_model(model)) != before)
            record["indices"].append(torch.as_tensor(indices).cpu().tolist())
    record["final"] = weights_of(acc.unwrap_model(model))
    return record


def check_against_replay(values: list[dict], world: Any, num_steps: int) -> None:
    """Every rank's gradients after each backward and final weights match the one-process replay."""
    micro_steps = [list(step) for step in zip(*(v["indices"] for v in values))]
    lengths = {len(v["indices"]) for v in values}
    expect_equal(len(lengths), 1, f"ranks trained on different numbers of batches: {[len(v['indices']) for v in values]}")
    expected = replay(values[0]["initial"], micro_steps, values[0]["sync"], num_steps)
    for rank, value in enumerate(values):
        expect_equal(value["sync"], values[0]["sync"], f"rank {rank}: sync_gradients per step (rank 0 saw {values[0]['sync']})")
        for step, grad in enumerate(value["grads"]):
            what = "synchronised (mean over ranks)" if value["sync"][step] else "local to the rank"
            expect_close(grad, expected["grads"][step][rank], f"rank {rank}: gradient after backward of micro-step {step + 1}, {what}")
        expect_close(value["final"], expected["final"], f"rank {rank}: final weights vs one process on the full batch")


def index_batches(world: Any, count: int, batch: int = BATCH) -> list[torch.Tensor]:
    """``count`` batches for this rank, cut from consecutive global steps as a sharded loader would."""
    n, r = world.size, world.rank
    return [torch.arange((k * n + r) * batch, (k * n + r + 1) * batch) for k in range(count)]


def sgd_of(model: Any) -> torch.optim.SGD:
    return torch.optim.SGD(model.parameters(), lr=LR)


class Recorder(torch.nn.Linear):
    """An nn.Linear that counts how often it was moved or converted (``Module._apply``: ``.to``, ``.cuda``, ...)."""

    def __init__(self) -> None:
        super().__init__(FEATURES, 1)
        self.moves = 0

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self.moves += 1
        return super()._apply(fn, *args, **kwargs)


class MovableBatch:
    """A batch that records whether it was sent to a device (it has ``.to``, as tensors do)."""

    def __init__(self, items: list[int]) -> None:
        self.items = items
        self.sent_to: list[str] = []

    def to(self, device: Any, non_blocking: bool = False) -> "MovableBatch":
        self.sent_to.append(str(device))
        return self


def movable_loader(size: int) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(list(range(size)), batch_size=BATCH, collate_fn=MovableBatch)


def training_objects(recorder: bool = False) -> tuple[Any, Any, Any, Any]:
    model = Recorder() if recorder else tiny_linear()
    optimizer = sgd_of(model)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)
    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=BATCH)
    return model, optimizer, loader, scheduler


class MyModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(FEATURES, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class DtypeRecorder:
    """A forward hook that records its module's output dtype (a class, so the module still pickles)."""

    def __init__(self) -> None:
        self.dtypes: list[torch.dtype] = []

    def __call__(self, module: Any, inputs: Any, output: torch.Tensor) -> None:
        self.dtypes.append(output.dtype)


def record_output_dtypes(module: torch.nn.Module) -> list[torch.dtype]:
    recorder = DtypeRecorder()
    module.register_forward_hook(recorder)
    return recorder.dtypes


def autocast_dtype(acc: Any, dtype: torch.dtype) -> torch.dtype:
    """The dtype torch's own autocast gives an ``nn.Linear`` output on the accelerator's device."""
    with torch.autocast(device_type=acc.device.type, dtype=dtype):
        return torch.nn.Linear(2, 2).to(acc.device)(torch.ones(1, 2, device=acc.device)).dtype


def agreed_free_port(world: Any, timeout: float = 10.0) -> int:
    """A free loopback port chosen by rank 0 (``simulators.ports.free_port``) and read by every rank from the
    case's shared directory."""
    path = os.path.join(world.shared_dir, "master_port")
    if world.rank == 0:
        port = free_port()
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            handle.write(str(port))
        os.replace(path + ".tmp", path)
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise RuntimeError(f"rank {world.rank}: rank 0 wrote no port to {path} within {timeout} s")
        time.sleep(0.01)
    with open(path, encoding="utf-8") as handle:
        return int(handle.read())


def fresh_rendezvous(world: Any) -> None:
    """Point the next ``init_process_group`` of every rank at a new port they agree on (:func:`agreed_free_port`),
    served by rank 0's own store: under torchrun (``TORCHELASTIC_USE_AGENT_STORE``) ranks would otherwise look for
    the launcher's store on that port and wait for ever. The worker restores the environment after the case."""
    os.environ["MASTER_PORT"] = str(agreed_free_port(world))
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
