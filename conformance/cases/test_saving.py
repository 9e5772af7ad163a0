"""Catalog section "Saving and loading".

Cases save into ``world.shared_dir`` (one directory all ranks of a case
run share) and read back what was written, with safetensors or
``torch.load``, not with the implementation's own loaders, unless the
loader is the rule under test. Who wrote a file is observed from inside
the pickler (`WriteRecorder`), so the check does not depend on timing.
Checkpoints are compared with what the same process computed before it
saved: training after `load_state` must continue bit for bit.
"""

from __future__ import annotations

import json
import os
import random
import re

import numpy as np
import torch
from torch.utils.data import DataLoader

from ..engine.case import ANY_WORLD, NotSupported, case
from ..support.checks import expect_equal, expect_raises, expect_ranks, expect_true
from ..support.training import MODEL_CASE_TIMEOUT

DISTRIBUTED_WORLDS = tuple(w for w in ANY_WORLD if w != "1")
FEATURES = 4


class Net(torch.nn.Module):
    """A tiny model; ``dropout`` makes training draw from torch's RNG."""

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.first = torch.nn.Linear(FEATURES, 8)
        self.dropout = torch.nn.Dropout(dropout)
        self.second = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.dropout(torch.relu(self.first(x))))


def _net(seed: int = 0, dropout: float = 0.0) -> Net:
    torch.manual_seed(seed)
    return Net(dropout)


def _inputs(step: int, rank: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch ``step`` of ``rank``: fixed numbers, so every run trains on the same data."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(4, FEATURES, generator=generator).to(device), torch.randn(4, 1, generator=generator).to(device)


def _flat(tensors) -> list[float]:
    return torch.cat([t.detach().cpu().double().reshape(-1) for t in tensors]).tolist()


def _path(world, *parts: str) -> str:
    return os.path.join(world.shared_dir, *parts)


class Counter:
    """A stateful object to register for checkpointing."""

    def __init__(self, value: int = 0) -> None:
        self.value = value

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


class WriteRecorder:
    """An object that notes, in this process, that it was pickled (that is, written by ``torch.save``)."""

    pickled = 0

    def __init__(self, payload) -> None:
        self.payload = payload

    def __getstate__(self) -> dict:
        WriteRecorder.pickled += 1
        return self.__dict__


# -- save ----------------------------------------------------------------------------


@case("save.once_per_machine")
def save_once_per_machine(impl, world):
    """``accelerator.save(obj, f)`` writes on the main process only; with ``save_on_each_node=True`` on each machine's.

    Each simulated machine saves to a folder of its own, as machines
    without a shared disk would; the object records whether this rank's
    ``save`` pickled it. Every machine's file loads back.
    """
    pickled = {}
    for on_each_node in (False, True):
        acc = impl.Accelerator(project_config=impl.utils.ProjectConfiguration(save_on_each_node=on_each_node))
        folder = _path(world, f"each_node={on_each_node}", f"machine{world.machine}")
        os.makedirs(folder, exist_ok=True)
        WriteRecorder.pickled = 0
        acc.save(WriteRecorder([0, 1, 2, 3]), os.path.join(folder, "array.pkl"))
        pickled[on_each_node] = WriteRecorder.pickled
        acc.wait_for_everyone()
        if on_each_node or world.machine == 0:
            loaded = torch.load(os.path.join(folder, "array.pkl"), weights_only=False)
            expect_equal(loaded.payload, [0, 1, 2, 3], f"machine {world.machine}: the saved object read back")
    return pickled


@save_once_per_machine.check
def _written_once(values, world):
    expect_ranks([v[False] for v in values], [rank == 0 for rank in range(world.size)], "save() wrote the object")
    expect_ranks([v[True] for v in values], world.local_ranks_of(0), "save() with save_on_each_node=True wrote the object")


@case("save.array_example")
def save_array_example(impl, world):
    """``accelerator.save([0, 1, 2, 3], "array.pkl")`` round-trips through ``torch.load``."""
    acc = impl.Accelerator()
    path = _path(world, "array.pkl")
    acc.save([0, 1, 2, 3], path)
    acc.wait_for_everyone()
    expect_equal(torch.load(path), [0, 1, 2, 3], "torch.load of the saved array")


# -- save_model ----------------------------------------------------------------------------


def _trained(acc, model, steps: int = 1):
    """``steps`` of SGD on the prepared ``model`` so that its weights are not the initial ones."""
    optimizer = acc.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    dtype = next(model.parameters()).dtype
    for step in range(steps):
        x, y = _inputs(step, acc.process_index, acc.device)
        acc.backward(torch.nn.functional.mse_loss(model(x.to(dtype)), y.to(dtype)))
        optimizer.step()
        optimizer.zero_grad()
    return model


@case("save_model.default", timeout=MODEL_CASE_TIMEOUT)
def save_model_default(impl, world):
    """``save_model(model, dir)`` writes ``model.safetensors`` of the unwrapped model, in its training precision.

    The model trains in float64 so that "training precision" is not fp32 by
    accident; the file's keys carry no wrapper prefix and load into a bare
    ``Net``.
    """
    from safetensors.torch import load_file

    acc = impl.Accelerator()
    model = _trained(acc, acc.prepare(_net().double()))
    folder = _path(world, "model")
    acc.wait_for_everyone()
    acc.save_model(model, folder)
    acc.wait_for_everyone()
    expect_equal(sorted(os.listdir(folder)), [impl.utils.SAFE_WEIGHTS_NAME], "files save_model wrote")
    saved = load_file(os.path.join(folder, impl.utils.SAFE_WEIGHTS_NAME))
    expected = acc.unwrap_model(model).state_dict()
    expect_equal(sorted(saved), sorted(expected), "keys of the saved state dict (the unwrapped model's)")
    expect_equal({k: str(v.dtype) for k, v in saved.items()}, {k: str(v.dtype) for k, v in expected.items()}, "dtypes saved")
    bare = Net().double()
    bare.load_state_dict(saved)
    expect_equal(_flat(bare.state_dict().values()), _flat(expected.values()), "a bare Net loaded from model.safetensors")


SHARD_LIMIT = 100  # bytes: Net's weights (49 float32 numbers, 196 bytes) take 2 shards


def _shard_layout(folder: str, pattern: str, index_name: str) -> dict:
    """What a sharded save wrote: its shard files, and the index's weight map checked against their contents."""
    names = sorted(os.listdir(folder))
    shards = [name for name in names if re.fullmatch(pattern, name)]
    expect_true(index_name in names, f"{index_name} should be written with the shards; files: {names}")
    with open(os.path.join(folder, index_name), encoding="utf-8") as stream:
        index = json.load(stream)
    return {"files": names, "shards": shards, "index": index}


@case("save_model.sharded", timeout=MODEL_CASE_TIMEOUT)
def save_model_sharded(impl, world):
    """``max_shard_size`` shards the weights with an index; ``safe_serialization=False`` writes ``pytorch_model*.bin``.

    The document's ``max_shard_size="1GB"`` keeps this small model in one
    file; a limit of 400 bytes gives ``model-0000i-of-0000n.safetensors``
    shards plus ``model.safetensors.index.json``, whose weight map names
    the shard holding each weight; the same with ``pytorch_model`` and
    ``.bin`` when not safe; and one ``pytorch_model.bin`` unsharded.
    """
    from safetensors.torch import load_file

    acc = impl.Accelerator()
    model = acc.prepare(_net())
    expected = acc.unwrap_model(model).state_dict()
    utils = impl.utils

    def save(name: str, **options) -> str:
        folder = _path(world, name)
        acc.save_model(model, folder, **options)
        acc.wait_for_everyone()
        return folder

    one = save("one_gb", max_shard_size="1GB", safe_serialization=True)
    expect_equal(sorted(os.listdir(one)), [utils.SAFE_WEIGHTS_NAME], 'files with max_shard_size="1GB"')
    for safe, name, stem, extension, index_name, read in (
        (True, "safe", "model", ".safetensors", utils.SAFE_WEIGHTS_INDEX_NAME, load_file),
        (False, "pickle", "pytorch_model", ".bin", utils.WEIGHTS_INDEX_NAME, torch.load),
    ):
        folder = save(name, max_shard_size=SHARD_LIMIT, safe_serialization=safe)
        layout = _shard_layout(folder, re.escape(stem) + r"-\d{5}-of-\d{5}" + re.escape(extension), index_name)
        expect_equal(layout["files"], sorted(layout["shards"] + [index_name]), f"{name}: files are shards and the index")
        count = len(layout["shards"])
        expect_true(count > 1, f"{name}: {SHARD_LIMIT}-byte shards of {len(expected)} weights: got {layout['shards']}")
        numbered = [f"{stem}-{i:05d}-of-{count:05d}{extension}" for i in range(1, count + 1)]
        expect_equal(layout["shards"], numbered, f"{name}: shard names")
        weight_map = layout["index"]["weight_map"]
        expect_equal(sorted(weight_map), sorted(expected), f"{name}: weights the index maps")
        for shard in layout["shards"]:
            content = read(os.path.join(folder, shard))
            expect_equal(sorted(content), sorted(k for k, v in weight_map.items() if v == shard), f"{name}: weights in {shard}")
            expect_equal(_flat(content[k] for k in sorted(content)), _flat(expected[k] for k in sorted(content)), f"{name}: values in {shard}")
        expect_true("total_size" in layout["index"].get("metadata", {}), f"{name}: the index's metadata should give total_size")
    single = save("pickle_single", safe_serialization=False)
    expect_equal(sorted(os.listdir(single)), [utils.WEIGHTS_NAME], "files with safe_serialization=False")


@case("save_model.reload", timeout=MODEL_CASE_TIMEOUT)
def save_model_reload(impl, world):
    """Quicktour: ``unwrap_model(model).load_state_dict(torch.load(".../pytorch_model.bin"))`` and
    ``load_checkpoint_in_model(unwrapped, save_directory, device_map={"": device})`` both restore the weights.

    The weights are overwritten with zeros before each reload; the sharded
    safetensors folder exercises the index path of `load_checkpoint_in_model`.
    """
    acc = impl.Accelerator()
    model = _trained(acc, acc.prepare(_net()))
    unwrapped = acc.unwrap_model(model)
    saved = _flat(unwrapped.state_dict().values())
    pickled, sharded = _path(world, "pickled"), _path(world, "sharded")
    acc.wait_for_everyone()
    acc.save_model(model, pickled, safe_serialization=False)
    acc.save_model(model, sharded, max_shard_size=SHARD_LIMIT)
    acc.wait_for_everyone()

    def zeroed() -> None:
        with torch.no_grad():
            for parameter in unwrapped.parameters():
                parameter.zero_()

    zeroed()
    unwrapped.load_state_dict(torch.load(os.path.join(pickled, "pytorch_model.bin")))
    expect_equal(_flat(unwrapped.state_dict().values()), saved, "weights after load_state_dict(torch.load(pytorch_model.bin))")
    for folder in (pickled, sharded):
        zeroed()
        impl.load_checkpoint_in_model(unwrapped, folder, device_map={"": acc.device})
        expect_equal(_flat(unwrapped.state_dict().values()), saved, f"weights after load_checkpoint_in_model({os.path.basename(folder)})")
        expect_true(all(p.device.type == acc.device.type for p in unwrapped.parameters()), "weights on the device_map's device")


@case("shard_checkpoint.doc_example", worlds=["1"])
def shard_checkpoint_doc_example(impl, world):
    """Weights of sizes [6, 6, 2, 6, 2, 2] with a limit of 10 shard as [6], [6+2], [6+2+2], in key order;
    a weight bigger than the limit gets a shard of its own (sizes in bytes: uint8 tensors)."""
    def sizes(*numbers: int) -> dict:
        return {f"w{i}": torch.zeros(n, dtype=torch.uint8) for i, n in enumerate(numbers)}

    shards, index = impl.utils.shard_checkpoint(sizes(6, 6, 2, 6, 2, 2), max_shard_size=10)
    expect_equal([sorted(s) for s in shards.values()], [["w0"], ["w1", "w2"], ["w3", "w4", "w5"]], "shards of [6, 6, 2, 6, 2, 2] at 10")
    names = [f"pytorch_model-{i:05d}-of-00003.bin" for i in (1, 2, 3)]
    expect_equal(list(shards), names, "shard file names")
    expect_equal(index["weight_map"], {"w0": names[0], "w1": names[1], "w2": names[1], "w3": names[2], "w4": names[2], "w5": names[2]}, "index weight_map")
    expect_equal(index["metadata"]["total_size"], 24, "index total_size (bytes)")
    shards, _ = impl.utils.shard_checkpoint(sizes(4, 15, 3), max_shard_size=10)
    expect_equal([sorted(s) for s in shards.values()], [["w0"], ["w1"], ["w2"]], "a 15-byte weight at a limit of 10")
    shards, index = impl.utils.shard_checkpoint(sizes(3, 3), max_shard_size=10)
    expect_equal((list(shards), index), (["pytorch_model.bin"], None), "weights under the limit: one file, no index")


@case("get_state_dict.unwrap", timeout=MODEL_CASE_TIMEOUT)
def get_state_dict_unwrap(impl, world):
    """``get_state_dict(net)`` has the user's keys (no ``module.``); ``unwrap=False`` the prepared wrapper's."""
    acc = impl.Accelerator()
    net = acc.prepare(_net())
    bare_keys = sorted(_net().state_dict())
    expect_equal(sorted(acc.get_state_dict(net)), bare_keys, "get_state_dict(net) keys")
    expect_equal(sorted(acc.get_state_dict(net, unwrap=False)), sorted(net.state_dict()), "get_state_dict(net, unwrap=False) keys")
    if world.size > 1:
        expect_true(all(k.startswith("module.") for k in acc.get_state_dict(net, unwrap=False)), "wrapped keys start with module.")
    expect_equal(_flat(acc.get_state_dict(net).values()), _flat(acc.unwrap_model(net).state_dict().values()), "values")


# -- save_state / load_state -------------------------------------------------------------------


def _draws() -> list[float]:
    """One number from each RNG a training script uses."""
    return [random.random(), float(np.random.rand()), *torch.rand(2).tolist()]


class _Run:
    """A model (with dropout), SGD with momentum, a StepLR and a registered counter, prepared (fp16: a scaler)."""

    def __init__(self, impl, seed: int) -> None:
        model = _net(seed, dropout=0.5)
        self.acc = impl.Accelerator(mixed_precision="fp16")
        impl.utils.set_seed(seed, device_specific=True)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        self.model, self.optimizer, self.scheduler = self.acc.prepare(model, optimizer, scheduler)
        self.counter = Counter()
        self.acc.register_for_checkpointing(self.counter)

    def train(self, steps: range) -> None:
        for step in steps:
            x, y = _inputs(step, self.acc.process_index, self.acc.device)
            with self.acc.autocast():
                loss = torch.nn.functional.mse_loss(self.model(x), y)
            self.acc.backward(loss)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad()
            self.counter.value += 1

    def first_backward(self) -> None:
        """One backward pass whose gradients are discarded (see `save_state_roundtrip`)."""
        x, y = _inputs(-1, self.acc.process_index, self.acc.device)
        self.acc.backward(torch.nn.functional.mse_loss(self.model(x), y))
        self.optimizer.zero_grad()

    def snapshot(self) -> dict:
        acc = self.acc
        momentum = [self.optimizer.state[p]["momentum_buffer"] for p in acc.unwrap_model(self.model).parameters()]
        return {
            "weights": _flat(acc.unwrap_model(self.model).parameters()),
            "momentum": _flat(momentum),
            "lr": self.scheduler.get_last_lr(),
            "scale": float(acc.scaler.get_scale()) if acc.scaler is not None else None,
            "counter": self.counter.value,
        }


@case("save_state.roundtrip", timeout=MODEL_CASE_TIMEOUT)
def save_state_roundtrip(impl, world):
    """``save_state(dir)`` then ``load_state(dir)`` restores model, optimizer, scheduler, scaler, RNG states and
    registered objects; training then continues bit for bit.

    A first run trains 3 steps, saves, draws from every RNG and trains 3
    more; a second run in the same processes, built from another seed,
    loads the checkpoint and must draw the same numbers and end with the
    same weights, momentum, learning rate, loss scale and counter. Dropout
    and per-rank seeds make every process's RNG state matter. A
    ``DistributedDataParallel`` model rebuilds its gradient buckets after
    its first backward, which changes the order in which 3 or more ranks'
    gradients are summed (and so the last bit); the second run therefore
    makes one discarded backward pass before loading, so that both runs
    compare steps made with rebuilt buckets.
    """
    folder = _path(world, "state")
    first = _Run(impl, seed=1)
    first.train(range(3))
    first.acc.save_state(folder)
    first.acc.wait_for_everyone()
    expected = {"draws": _draws()}
    first.train(range(3, 6))
    expected.update(first.snapshot())

    second = _Run(impl, seed=2)
    second.first_backward()
    second.acc.load_state(folder)
    got = {"draws": _draws()}
    second.train(range(3, 6))
    got.update(second.snapshot())
    for key in expected:
        expect_equal(got[key], expected[key], f"rank {world.rank}: {key} after load_state and 3 more steps, against the run that saved")
    return expected["draws"]


@save_state_roundtrip.check
def _per_rank_rng(values, world):
    expect_equal(len({tuple(v) for v in values}), world.size, "RNG draws after loading differ between ranks (each got its own)")


def _epochs(acc, loader, skipped_loader=None, epochs: int = 1) -> list:
    """Batches (as lists) of ``skipped_loader`` (if given) then of ``epochs`` epochs of ``loader``."""
    passes = ([skipped_loader] if skipped_loader is not None else []) + [loader] * epochs
    return [[batch.tolist() for batch in current] for current in passes]


def _resume_point(step: int, steps_per_epoch: int) -> tuple[int, int]:
    """(epoch to start, batches of it to skip) after a save at ``step`` (counted from 1 over all epochs), as HF's
    ``examples/by_feature/checkpointing.py`` computes them: a save in an epoch's last step resumes at the next
    epoch's start, through ``skip_first_batches(loader, 0)``."""
    return divmod(step, steps_per_epoch)


RESUME_LENGTH, RESUME_BATCH, RESUME_AT, RESUME_EPOCHS = 96, 2, 3, 4


@case("save_state.resume_data_order")
def save_state_resume_data_order(impl, world):
    """Resuming mid-epoch or at an epoch's end (``load_state`` + ``skip_first_batches``) with a shuffled loader
    yields exactly the batches an uninterrupted run yields, in this epoch and the next ones (accelerate issues
    #3996, #2016, #3242, #1451).

    Uninterrupted: ``RESUME_EPOCHS`` epochs. Interrupted: epoch 0, then
    batches of epoch 1 taken in a loop and ``save_state`` after the last
    one taken: after ``RESUME_AT`` (mid-epoch), and after all of them (the
    epoch's last step, its loop not ended: where HF's checkpointing example
    saves when the step count is a multiple of the epoch's length).
    Resumed (fresh loader, another seed): ``load_state``, then as the
    example, the epoch and batch to start from computed from the step
    (`_resume_point`), ``skip_first_batches(loader, batch)`` for that
    epoch (0 at the epoch boundary) and the loader for every epoch after.
    With ``shuffle=True``, and with ``use_seedable_sampler=True``.
    """
    results = {}
    for name, seedable in (("shuffle", False), ("seedable sampler", True)):
        config = impl.DataLoaderConfiguration(use_seedable_sampler=seedable)

        def prepared(seed: int):
            impl.utils.set_seed(seed)
            acc = impl.Accelerator(dataloader_config=config)
            return acc, acc.prepare(DataLoader(torch.arange(RESUME_LENGTH), batch_size=RESUME_BATCH, shuffle=True))

        acc, loader = prepared(5)
        uninterrupted = _epochs(acc, loader, epochs=RESUME_EPOCHS)
        steps_per_epoch = len(loader)
        for taken in (RESUME_AT, steps_per_epoch):
            acc, loader = prepared(5)
            interrupted = _epochs(acc, loader)
            batches = iter(loader)
            interrupted.append([next(batches).tolist() for _ in range(taken)])
            folder = _path(world, name.replace(" ", "_"), f"taken={taken}")
            acc.save_state(folder)
            acc.wait_for_everyone()
            saved_at = steps_per_epoch + taken
            epoch, skip = _resume_point(saved_at, steps_per_epoch)
            acc, loader = prepared(77)
            acc.load_state(folder)
            resumed = _epochs(acc, loader, acc.skip_first_batches(loader, skip), epochs=RESUME_EPOCHS - 1 - epoch)
            where = f"{name}: saved after {taken} of epoch 1's {steps_per_epoch} batches, resumed at epoch {epoch} batch {skip}"
            expect_equal(interrupted, [uninterrupted[0], uninterrupted[1][:taken]], f"{where}: the interrupted run")
            expect_equal(
                {e: batches for e, batches in enumerate(resumed, start=epoch)},
                {e: uninterrupted[e][skip if e == epoch else 0:] for e in range(epoch, RESUME_EPOCHS)},
                f"{where}: epoch -> the batches of each epoch after resuming, against the uninterrupted run",
            )
        results[name] = uninterrupted
    return results


@save_state_resume_data_order.check
def _orders_are_shuffled(values, world):
    for name in values[0]:
        epochs = values[0][name]
        expect_true(epochs[0] != epochs[1], f"{name}: epochs 0 and 1 have the same order; the case needs a shuffled loader")


#: The script's steps per process and epoch, its epochs, and the steps it saves after: mid-epoch 0, the end of
#: epoch 0 (an epoch boundary) and mid-epoch 1.
PATTERN_SEED, PATTERN_STEPS, PATTERN_EPOCHS, PATTERN_SAVES = 42, 4, 3, (2, 4, 6)


def _checkpointing_script(impl, world, resume_from: int | None = None) -> dict[int, tuple]:
    """The documents' checkpointing script (HF's ``examples/by_feature/checkpointing.py``), run once.

    An `Accelerator`, ``set_seed``, a shuffled loader of ``PATTERN_STEPS``
    batches per process and a model with dropout, all prepared;
    ``PATTERN_EPOCHS`` epochs, the step counted over them, ``save_state``
    to ``step_<n>`` after each step n of ``PATTERN_SAVES``. With
    ``resume_from`` the same script resumes instead from ``step_<n>``:
    ``load_state`` right after ``prepare``, then the starting epoch and the
    step in it from the checkpoint's step (`_resume_point`: the next
    epoch's start when it was an epoch's last step),
    ``skip_first_batches(loader, step)`` for that epoch and the loader for
    the next ones; it saves nothing. Returns, per step made, the rows its
    batch holds and one number from each RNG (`_draws`), taken as the step
    begins.
    """
    acc = impl.Accelerator()
    impl.utils.set_seed(PATTERN_SEED)
    rows = torch.arange(PATTERN_STEPS * RESUME_BATCH * acc.num_processes)
    loader = DataLoader(rows, batch_size=RESUME_BATCH, shuffle=True)
    model = _net(PATTERN_SEED, dropout=0.5)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    overall_step, starting_epoch, resume_step = 0, 0, None
    if resume_from is not None:
        acc.load_state(_path(world, f"step_{resume_from}"))
        starting_epoch, resume_step = _resume_point(resume_from, len(loader))
        overall_step = resume_from
    seen = {}
    for epoch in range(starting_epoch, PATTERN_EPOCHS):
        resuming = resume_step is not None and epoch == starting_epoch
        active = acc.skip_first_batches(loader, resume_step) if resuming else loader
        for batch in active:
            draws = _draws()
            loss = model(batch.float().unsqueeze(1).expand(-1, FEATURES) / rows.numel()).pow(2).mean()
            acc.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            overall_step += 1
            seen[overall_step] = (batch.tolist(), draws)
            if resume_from is None and overall_step in PATTERN_SAVES:
                acc.save_state(_path(world, f"step_{overall_step}"))
    acc.wait_for_everyone()
    return seen


@case("save_state.resume_data_order", timeout=MODEL_CASE_TIMEOUT)
def save_state_resume_as_documented(impl, world):
    """Resuming as the documents' checkpointing script does continues the run: each resumed step sees the rows
    and the random numbers the same step of the uninterrupted run saw, in the epoch resumed and the next ones
    (accelerate issue #3996).

    The pattern (`_checkpointing_script`): the script runs ``PATTERN_EPOCHS``
    epochs, saving after each step of ``PATTERN_SAVES`` (mid-epoch 0, the
    last step of epoch 0, mid-epoch 1); the same script, started afresh
    (same seed), resumes from each checkpoint: ``load_state``, then
    ``skip_first_batches`` for the rest of the epoch (all of the next epoch,
    ``skip_first_batches(loader, 0)``, after an epoch's last step), then
    the loader for the epochs after. Unlike `save_state_resume_data_order`
    (another seed, batches only), the resumed loader here begins its first
    epoch after ``load_state`` put back the random states of the moment of
    the save: whatever the resumed loader draws as it starts (its
    iterator's seed, a sampler's seed) comes from those states, which the
    interrupted run had already moved past, except at an epoch boundary,
    where the uninterrupted run's next epoch drew them after the save too.
    The random numbers are save_state.roundtrip's promise (RNG states
    restored, training continues) in this pattern.
    """
    uninterrupted = _checkpointing_script(impl, world)
    per_epoch = [[uninterrupted[s][0] for s in range(1 + e * PATTERN_STEPS, 1 + (e + 1) * PATTERN_STEPS)] for e in range(PATTERN_EPOCHS)]
    expect_true(per_epoch[0] != per_epoch[1], "epochs 0 and 1 have the same order; the case needs a shuffled loader")
    for saved_at in PATTERN_SAVES:
        resumed = _checkpointing_script(impl, world, resume_from=saved_at)
        expected_steps = [step for step in uninterrupted if step > saved_at]
        expect_equal(list(resumed), expected_steps, f"the steps the script resumed from step_{saved_at} makes")
        for part, what in ((0, "rows"), (1, "random numbers (random, numpy, torch)")):
            expect_equal(
                {step: resumed[step][part] for step in expected_steps},
                {step: uninterrupted[step][part] for step in expected_steps},
                f"rank {world.rank}: step -> the {what} each step resumed from the step {saved_at} checkpoint sees "
                f"({PATTERN_STEPS} steps per epoch), against the uninterrupted run",
            )


def _model_optimizer(acc):
    model = _net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    return acc.prepare(model, optimizer, scheduler)


@case("save_state.file_names", timeout=MODEL_CASE_TIMEOUT)
def save_state_file_names(impl, world):
    """Files follow the constants: ``model.safetensors`` (``pytorch_model.bin`` unsafe), ``optimizer.bin``,
    ``scheduler.bin``, ``scaler.pt``, ``random_states_<rank>.pkl`` for every rank.

    ``scaler.pt`` is expected where the fp16 Accelerator has a gradient
    scaler (whether it must have one is the rule of autocast.fp16_scaler).
    """
    utils = impl.utils
    acc = impl.Accelerator(mixed_precision="fp16")
    _model_optimizer(acc)
    common = [f"{utils.OPTIMIZER_NAME}.bin", f"{utils.SCHEDULER_NAME}.bin"] + ([utils.SCALER_NAME] if acc.scaler is not None else [])
    common += [f"{utils.RNG_STATE_NAME}_{rank}.pkl" for rank in range(world.size)]
    for safe, model_file in ((True, utils.SAFE_WEIGHTS_NAME), (False, f"{utils.MODEL_NAME}.bin")):
        folder = _path(world, f"safe={safe}")
        acc.save_state(folder, safe_serialization=safe)
        acc.wait_for_everyone()
        files = set(os.listdir(folder))
        missing = sorted(set(common + [model_file]) - files)
        expect_equal(missing, [], f"files missing from save_state(safe_serialization={safe}) (found {sorted(files)})")
    expect_equal(
        (utils.SAFE_WEIGHTS_NAME, utils.MODEL_NAME, utils.OPTIMIZER_NAME, utils.SCHEDULER_NAME, utils.SCALER_NAME, utils.RNG_STATE_NAME),
        ("model.safetensors", "pytorch_model", "optimizer", "scheduler", "scaler.pt", "random_states"),
        "the constants",
    )


def _automatic(impl, world, **options):
    config = impl.utils.ProjectConfiguration(project_dir=_path(world, "project"), automatic_checkpoint_naming=True, **options)
    acc = impl.Accelerator(project_config=config)
    model, _, _ = _model_optimizer(acc)
    return acc, model


def _set_weights(acc, model, value: float) -> None:
    with torch.no_grad():
        for parameter in acc.unwrap_model(model).parameters():
            parameter.fill_(value)


@case("save_state.auto_naming", timeout=MODEL_CASE_TIMEOUT)
def save_state_auto_naming(impl, world):
    """``automatic_checkpoint_naming=True``: saves go to ``project_dir/checkpoints/checkpoint_<i>``;
    ``load_state()`` with no argument loads the latest."""
    acc, model = _automatic(impl, world)
    for value in range(3):
        _set_weights(acc, model, float(value))
        acc.save_state()
    acc.wait_for_everyone()
    folder = _path(world, "project", "checkpoints")
    expect_equal(sorted(os.listdir(folder)), ["checkpoint_0", "checkpoint_1", "checkpoint_2"], f"folders in {folder}")
    _set_weights(acc, model, -1.0)
    acc.load_state()
    expect_equal(set(_flat(acc.unwrap_model(model).parameters())), {2.0}, "weights after load_state() (the third save had 2.0)")


@case("save_state.total_limit", timeout=MODEL_CASE_TIMEOUT)
def save_state_total_limit(impl, world):
    """``total_limit=2``: after four saves only the two newest checkpoints remain (and the latest loads)."""
    acc, model = _automatic(impl, world, total_limit=2)
    for value in range(4):
        _set_weights(acc, model, float(value))
        acc.save_state()
        acc.wait_for_everyone()
    folder = _path(world, "project", "checkpoints")
    expect_equal(sorted(os.listdir(folder)), ["checkpoint_2", "checkpoint_3"], f"folders in {folder} after 4 saves")
    _set_weights(acc, model, -1.0)
    acc.load_state()
    expect_equal(set(_flat(acc.unwrap_model(model).parameters())), {3.0}, "weights after load_state() (the newest had 3.0)")


@case("register_for_checkpointing")
def register_for_checkpointing(impl, world):
    """Registered objects are saved and restored; an object without ``state_dict``/``load_state_dict`` is rejected
    with an error that says what is missing."""
    acc = impl.Accelerator()
    counter = Counter(7)
    acc.register_for_checkpointing(counter)
    folder = _path(world, "state")
    acc.save_state(folder)
    acc.wait_for_everyone()
    counter.value = 0
    acc.load_state(folder)
    expect_equal(counter.value, 7, "the registered counter after load_state")
    error = expect_raises(lambda: acc.register_for_checkpointing(object()), ValueError, "register_for_checkpointing(object())")
    expect_true("state_dict" in str(error), f"the error should say state_dict is needed, got: {error}")


@case("save_state.pre_hooks", timeout=MODEL_CASE_TIMEOUT)
def save_state_pre_hooks(impl, world):
    """Save hooks get ``(models, weights, dir)``, load hooks ``(models, dir)``; ``handle.remove()`` removes them.

    The save hook writes a file into the directory it is given, which must
    be part of the checkpoint the load hook then sees.
    """
    acc = impl.Accelerator()
    model, _, _ = _model_optimizer(acc)
    calls = []

    def save_hook(models, weights, output_dir):
        calls.append(("save", [acc.unwrap_model(m) is acc.unwrap_model(model) for m in models], [_flat(w.values()) for w in weights]))
        with open(os.path.join(output_dir, f"hook_{world.rank}.txt"), "w", encoding="utf-8") as stream:
            stream.write("written by the save hook")

    def load_hook(models, input_dir):
        calls.append(("load", [acc.unwrap_model(m) is acc.unwrap_model(model) for m in models], os.path.isfile(os.path.join(input_dir, f"hook_{world.rank}.txt"))))

    save_handle = acc.register_save_state_pre_hook(save_hook)
    load_handle = acc.register_load_state_pre_hook(load_hook)
    folder = _path(world, "hooked")
    acc.save_state(folder)
    acc.wait_for_everyone()
    acc.load_state(folder)
    weights = _flat(acc.unwrap_model(model).state_dict().values())
    expect_equal(calls, [("save", [True], [weights]), ("load", [True], True)], "hook calls (models are the prepared one)")
    save_handle.remove()
    load_handle.remove()
    acc.save_state(_path(world, "unhooked"))
    acc.wait_for_everyone()
    acc.load_state(_path(world, "unhooked"))
    expect_equal(len(calls), 2, "hook calls after handle.remove()")


#: Importing 🤗 Transformers alone takes seconds (about 30 s on a loaded 2-core machine).
TRANSFORMERS_CASE_TIMEOUT = 120.0
#: What the case imports on first use: the model's module, and DeepSpeed, which ``save_pretrained`` reaches
#: through HF accelerate's ``extract_model_from_parallel`` wherever DeepSpeed is installed.
TRANSFORMERS_IMPORTS = ("transformers.models.bert.modeling_bert", "deepspeed")


@case("save.transformers_save_pretrained", worlds=DISTRIBUTED_WORLDS, timeout=TRANSFORMERS_CASE_TIMEOUT,
      imports=TRANSFORMERS_IMPORTS)
def transformers_save_pretrained(impl, world):
    """A tiny Transformers model from a config, prepared, saved with ``save_pretrained(dir, is_main_process=...,
    save_function=accelerator.save)``, written once and reloaded with ``from_pretrained``; NOT_SUPPORTED without Transformers.

    Transformers 5 dropped ``save_function`` (huggingface/transformers#42734, huggingface/accelerate#3913): its
    ``save_pretrained`` takes the documented call and ignores the hook with its other keyword arguments, and writes
    the weights itself on rank 0. Where Transformers never calls the hook, the rest of the pattern is still checked
    (the prepared model unwraps to the user's, the folder reloads as its weights) and the case is NOT_SUPPORTED
    naming that: never a PASS that checked no ``accelerator.save``.
    """
    try:
        import transformers
    except ImportError as error:
        raise NotSupported("🤗 Transformers is not installed") from error
    acc = impl.Accelerator()
    config = transformers.BertConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16)
    model = acc.prepare(transformers.BertModel(config))
    folder = _path(world, "pretrained")
    hooked = []  # save_function calls on this rank (Transformers 4 calls it on every rank; 5 on none)
    writes = []  # torch.save calls made on this rank through accelerator.save
    real_torch_save = torch.save

    def counting_torch_save(obj, f, *args, **kwargs):
        writes.append(str(f))
        return real_torch_save(obj, f, *args, **kwargs)

    def save_function(obj, f, **kwargs):
        hooked.append(str(f))
        torch.save = counting_torch_save
        try:
            acc.save(obj, f, **kwargs)
        finally:
            torch.save = real_torch_save

    acc.unwrap_model(model).save_pretrained(folder, is_main_process=acc.is_main_process, save_function=save_function, safe_serialization=False)
    acc.wait_for_everyone()
    reloaded = transformers.BertModel.from_pretrained(folder)
    expect_equal(_flat(reloaded.state_dict().values()), _flat(acc.unwrap_model(model).state_dict().values()), "from_pretrained weights")
    if not hooked:
        raise NotSupported(
            f"🤗 Transformers {transformers.__version__} is installed here: its save_pretrained ignores save_function "
            "(dropped in Transformers 5: huggingface/transformers#42734, huggingface/accelerate#3913), so the documented "
            "save_function=accelerator.save cannot be checked; the rest held (unwrap_model(model).save_pretrained(dir, "
            "is_main_process=...) wrote the folder, from_pretrained(dir) read the prepared weights back)"
        )
    return bool(writes)


@transformers_save_pretrained.check
def _pretrained_written_once(values, world):
    expect_ranks(values, [rank == 0 for rank in range(world.size)], "save_pretrained wrote the weights")
