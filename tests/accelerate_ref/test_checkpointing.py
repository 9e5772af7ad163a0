"""Saving and loading on one process: files, shards, checkpoints, resumption, and every kind of bad input.

Catalog: save.array_example, save_model.default, save_model.sharded,
save_model.reload, shard_checkpoint.doc_example, get_state_dict.unwrap,
save_state.roundtrip, save_state.resume_data_order, save_state.file_names,
save_state.auto_naming, save_state.total_limit, register_for_checkpointing,
save_state.pre_hooks.
"""

from __future__ import annotations

import json
import os
import random
import warnings
from collections import OrderedDict

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader

from accelerate_ref import Accelerator, AcceleratorState, DataLoaderConfiguration, GradientState, ProjectConfiguration
from accelerate_ref._checkpointing.store import MANIFEST_NAME, CheckpointError
from accelerate_ref.utils import (
    checkpoint_files,
    convert_file_size_to_int,
    dtype_byte_size,
    load,
    load_checkpoint_in_model,
    load_state_dict,
    save,
    shard_checkpoint,
    write_atomically,
)


def fresh(**kwargs) -> Accelerator:
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    return Accelerator(**kwargs)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(4, 8)
        self.second = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x)))


def net(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    return Net()


def flat(module: torch.nn.Module) -> list[float]:
    return torch.nn.utils.parameters_to_vector(module.parameters()).tolist()


class Counter:
    def __init__(self, value=0) -> None:
        self.value = value

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


# -- files -------------------------------------------------------------------------------


def test_write_atomically_keeps_the_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "f.bin"
    write_atomically(path, lambda stream: stream.write(b"old"))

    def failing(stream):
        stream.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(path, failing)
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["f.bin"]


def test_save_round_trips_and_loading_runs_no_code(tmp_path):
    fresh()
    save([0, 1, 2, 3], tmp_path / "array.pkl")
    assert load(tmp_path / "array.pkl") == [0, 1, 2, 3]
    save({"counter": Counter(3)}, tmp_path / "object.pkl")
    with pytest.raises(Exception, match="(?i)weights.only"):
        load(tmp_path / "object.pkl")
    assert load(tmp_path / "object.pkl", weights_only=False)["counter"].value == 3


def test_safe_serialization_stores_tied_tensors_once(tmp_path, caplog):
    fresh()
    shared = torch.arange(4.0)
    state_dict = OrderedDict(embed=shared, tied=shared, other=torch.ones(2))
    save(state_dict, tmp_path / "w.safetensors", safe_serialization=True)
    assert sorted(load_file(tmp_path / "w.safetensors")) == ["embed", "other"]
    assert list(state_dict) == ["embed", "other"], "the aliases leave the state dict itself, as in HF 1.15"
    assert "Removed shared tensor {'tied'} while saving" in caplog.text
    with pytest.raises(RuntimeError, match="Some tensors share memory"):  # only an OrderedDict is cleaned
        save({"embed": shared, "tied": shared}, tmp_path / "d.safetensors", safe_serialization=True)
    with pytest.raises(ValueError, match="Expected a dict of \\[str, torch.Tensor\\]"):
        save([1, 2], tmp_path / "list.safetensors", safe_serialization=True)


# -- shards and model files ------------------------------------------------------------


def test_sizes():
    assert convert_file_size_to_int(7) == 7
    assert convert_file_size_to_int("1GB") == 10**9 and convert_file_size_to_int("1GiB") == 2**30
    assert convert_file_size_to_int("5MB") == 5 * 10**6 and convert_file_size_to_int("8Mb") == 10**6
    assert convert_file_size_to_int("1.5KiB") == 1536
    for bad in ("ten", "5 parsecs", -1):
        with pytest.raises(ValueError):
            convert_file_size_to_int(bad)
    assert dtype_byte_size(torch.float16) == 2 and dtype_byte_size(torch.bool) == 1 / 8


def uint8(*sizes: int) -> dict[str, torch.Tensor]:
    return {f"w{i}": torch.zeros(n, dtype=torch.uint8) for i, n in enumerate(sizes)}


def test_shard_checkpoint_documented_example_and_oversized_weights():
    shards, index = shard_checkpoint(uint8(6, 6, 2, 6, 2, 2), 10)
    assert [list(s) for s in shards.values()] == [["w0"], ["w1", "w2"], ["w3", "w4", "w5"]]
    assert list(shards) == [f"pytorch_model-0000{i}-of-00003.bin" for i in (1, 2, 3)]
    assert index == {"metadata": {"total_size": 24}, "weight_map": {k: f for f, s in shards.items() for k in s}}
    shards, _ = shard_checkpoint(uint8(4, 15, 3), 10)
    assert [list(s) for s in shards.values()] == [["w0"], ["w1"], ["w2"]]
    shards, index = shard_checkpoint(uint8(1, 2), "1GB", weights_name="model.safetensors")
    assert list(shards) == ["model.safetensors"] and index is None


def test_shard_checkpoint_keeps_tied_weights_together():
    tied = torch.zeros(6, dtype=torch.uint8)
    shards, index = shard_checkpoint({"a": tied, "b": torch.zeros(6, dtype=torch.uint8), "a_tied": tied}, 10)
    assert index["weight_map"]["a_tied"] == index["weight_map"]["a"] and index["metadata"]["total_size"] == 12


def test_save_model_single_sharded_and_stale_files(tmp_path):
    acc = fresh()
    model = acc.prepare(net().double())
    acc.save_model(model, tmp_path)
    assert os.listdir(tmp_path) == ["model.safetensors"]
    saved = load_file(tmp_path / "model.safetensors")
    assert all(t.dtype == torch.float64 for t in saved.values()), "the training precision is kept"
    acc.save_model(model, tmp_path, max_shard_size=100)
    files = sorted(os.listdir(tmp_path))
    assert files == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)] + ["model.safetensors.index.json"], (
        "float64 weights of 256, 64, 64 and 8 bytes in 100-byte shards; the earlier single file is removed"
    )
    acc.save_model(model, tmp_path, max_shard_size=10**6)
    assert sorted(os.listdir(tmp_path)) == ["model.safetensors"], "stale shards and index are removed"
    acc.save_model(model, tmp_path, safe_serialization=False, max_shard_size=100)
    assert "pytorch_model.bin.index.json" in os.listdir(tmp_path) and "model.safetensors" in os.listdir(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    acc.save_model(model, tmp_path)
    assert "config.json" in os.listdir(tmp_path), "files that are not weights stay"


def test_save_model_refuses_a_file_and_meta_weights(tmp_path, caplog):
    acc = fresh()
    (tmp_path / "file").write_text("x")
    assert acc.save_model(net(), tmp_path / "file") is None  # HF 1.15 logs and returns
    assert f"Provided path ({tmp_path / 'file'}) should be a directory, not a file" in caplog.text
    with torch.device("meta"):
        ghost = Net()
    with pytest.raises(RuntimeError, match="You can't save the model since some parameters are on the meta device."):
        acc.save_model(ghost, tmp_path / "ghost")
    assert not (tmp_path / "ghost").exists()


def test_get_state_dict_unwraps():
    acc = fresh()
    model = acc.prepare(net())
    assert list(acc.get_state_dict(model)) == list(Net().state_dict())
    assert acc.get_state_dict(model, unwrap=False).keys() == model.state_dict().keys()


@pytest.mark.parametrize("layout", ["file", "index", "folder", "sharded folder", "pickle folder"])
def test_load_checkpoint_in_model_layouts(tmp_path, layout):
    acc = fresh()
    source = net(1)
    shard_size = 100 if "sharded" in layout or layout == "index" else "10GB"
    acc.save_model(source, tmp_path, max_shard_size=shard_size, safe_serialization=layout != "pickle folder")
    checkpoint = {
        "file": tmp_path / "model.safetensors",
        "index": tmp_path / "model.safetensors.index.json",
    }.get(layout, tmp_path)
    target = net(2)
    load_checkpoint_in_model(target, checkpoint, device_map={"": acc.device}, strict=True)
    assert flat(target) == flat(source)


def test_load_checkpoint_in_model_device_maps_dtypes_and_meta(tmp_path):
    acc = fresh()
    source = net(1)
    acc.save_model(source, tmp_path)
    half = net(2)
    load_checkpoint_in_model(half, tmp_path, device_map={"first": "cpu", "second": torch.device("cpu", 0)}, dtype="float16", keep_in_fp32_modules=["second"])
    assert half.first.weight.dtype == torch.float16 and half.second.weight.dtype == torch.float32
    assert torch.equal(half.second.weight, source.second.weight)
    with pytest.raises(ValueError, match="doesn't have any device set"):
        load_checkpoint_in_model(net(), tmp_path, device_map={"first": "cpu"})
    with pytest.raises(ValueError, match="offload_folder"):  # disk offload needs a folder to write to
        load_checkpoint_in_model(net(), tmp_path, device_map={"": "disk"})
    with torch.device("meta"):
        ghost = Net()
    with pytest.raises(ValueError, match="process group"):  # torch's set_model_state_dict on meta weights, as in HF
        load_checkpoint_in_model(ghost, tmp_path, strict=True)
    load_checkpoint_in_model(ghost, tmp_path, device_map={"": "cpu"}, strict=True)
    assert ghost.first.weight.device.type == "cpu" and flat(ghost) == flat(source)


def test_load_checkpoint_in_model_mismatches(tmp_path):
    acc = fresh()
    acc.save_model(net(), tmp_path)
    wide = torch.nn.Sequential()
    wide.first, wide.second, wide.extra = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1), torch.nn.Linear(1, 1)
    for strict in (False, True):  # weights the checkpoint lacks are left as they are, as in HF (torch's set_model_state_dict)
        load_checkpoint_in_model(wide, tmp_path, strict=strict)
    wrong = torch.nn.Sequential()
    wrong.first, wrong.second = torch.nn.Linear(4, 7), torch.nn.Linear(7, 1)
    with pytest.raises(RuntimeError, match=r"size mismatch for first\.weight.*\[8, 4\].*\[7, 4\]"):
        load_checkpoint_in_model(wrong, tmp_path)


def test_checkpoint_files_and_damaged_weights(tmp_path):
    with pytest.raises(ValueError, match="is not a folder containing a `.index.json` file"):
        checkpoint_files(tmp_path)
    (tmp_path / "a.index.json").write_text(json.dumps({"weight_map": {}}))
    (tmp_path / "b.index.json").write_text(json.dumps({"weight_map": {}}))
    with pytest.raises(ValueError, match="more than one `.index.json` file"):
        checkpoint_files(tmp_path)
    with pytest.raises(ValueError, match="`checkpoint` should be the path to a file"):
        checkpoint_files(tmp_path / "missing")
    fresh()
    save(net().state_dict(), tmp_path / "w.safetensors", safe_serialization=True)
    data = (tmp_path / "w.safetensors").read_bytes()
    (tmp_path / "w.safetensors").write_bytes(data[: len(data) // 2])
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    with pytest.raises(SafetensorError):
        load_state_dict(str(tmp_path / "w.safetensors"))
    save_file({"x": torch.ones(1)}, tmp_path / "tf.safetensors", metadata={"format": "tf"})
    with pytest.raises(ValueError, match="saved with tf, we need a the pt format"):
        load_state_dict(str(tmp_path / "tf.safetensors"))


# -- save_state / load_state --------------------------------------------------------------


class Run:
    """A prepared model (dropout), SGD with momentum, StepLR, an fp16 scaler and a registered counter."""

    def __init__(self, seed: int, **accelerator_options) -> None:
        self.acc = fresh(mixed_precision="fp16", **accelerator_options)
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)
        self.model, self.optimizer, self.scheduler = self.acc.prepare(model, optimizer, scheduler)
        self.counter = Counter()
        self.acc.register_for_checkpointing(self.counter)

    def train(self, steps) -> None:
        for step in steps:
            x = torch.full((3, 4), float(step))
            with self.acc.accumulate(self.model):
                with self.acc.autocast():
                    loss = self.model(x).pow(2).mean()
                self.acc.backward(loss)
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer.zero_grad()
            self.counter.value += 1

    def snapshot(self) -> dict:
        return {
            "weights": flat(self.model),
            "momentum": [self.optimizer.state[p]["momentum_buffer"].tolist() for p in self.model.parameters()],
            "lr": self.scheduler.get_last_lr(),
            "scale": self.acc.scaler.get_scale(),
            "counter": self.counter.value,
            "step": self.acc.step,
            "draws": [random.random(), float(np.random.rand()), torch.rand(2).tolist()],
        }


def test_save_state_round_trip_continues_bit_for_bit(tmp_path):
    first = Run(1, gradient_accumulation_steps=2)
    first.train(range(3))
    first.acc.save_state(tmp_path / "ckpt")
    first.train(range(3, 7))
    expected = first.snapshot()
    second = Run(2, gradient_accumulation_steps=2)
    second.acc.load_state(tmp_path / "ckpt")
    assert second.acc.step == 3, "Accelerator.step (accumulation count) is restored"
    second.train(range(3, 7))
    assert second.snapshot() == expected


def test_file_names_follow_the_constants(tmp_path):
    run = Run(0)
    run.acc.prepare(DataLoader(range(8), batch_size=2))
    run.acc.save_state(tmp_path / "safe")
    run.acc.save_state(tmp_path / "pickle", safe_serialization=False)
    common = {"optimizer.bin", "scheduler.bin", "scaler.pt", "sampler.bin", "random_states_0.pkl", "custom_checkpoint_0.pkl", MANIFEST_NAME}
    assert set(os.listdir(tmp_path / "safe")) == common | {"model.safetensors"}
    assert set(os.listdir(tmp_path / "pickle")) == common | {"pytorch_model.bin"}
    assert set(json.loads((tmp_path / "safe" / MANIFEST_NAME).read_text())["files"]) == (common | {"model.safetensors"}) - {MANIFEST_NAME}


def test_second_objects_get_numbered_files(tmp_path):
    acc = fresh()
    models = [net(), net(1)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
    acc.prepare(*models, *optimizers)
    acc.save_state(tmp_path)
    assert {"model.safetensors", "model_1.safetensors", "optimizer.bin", "optimizer_1.bin"} <= set(os.listdir(tmp_path))


def automatic(tmp_path, **options) -> tuple[Accelerator, Net]:
    acc = fresh(project_config=ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True, **options))
    return acc, acc.prepare(net())


def fill(model, value: float) -> None:
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(value)


def test_automatic_naming_total_limit_and_resuming_the_count(tmp_path):
    acc, model = automatic(tmp_path, total_limit=2)
    for value in range(4):
        fill(model, value)
        assert acc.save_state().endswith(f"checkpoint_{value}")
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["checkpoint_2", "checkpoint_3"]
    acc, model = automatic(tmp_path, total_limit=2)
    acc.load_state()
    assert set(flat(model)) == {3.0} and acc.save_iteration == 4, "the newest loads and the numbering continues"
    acc.save_state()
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["checkpoint_3", "checkpoint_4"]
    acc.project_configuration.iteration = 3
    with pytest.raises(ValueError, match=r"checkpoint_3 \(3\) already exists"):
        acc.save_state()
    with pytest.raises(ValueError, match="project_dir"):
        fresh(project_config=ProjectConfiguration(automatic_checkpoint_naming=True)).save_state()


def test_newest_complete_checkpoint_wins_over_partial_ones(tmp_path):
    acc, model = automatic(tmp_path)
    fill(model, 1.0)
    acc.save_state()
    (tmp_path / "checkpoints" / ".checkpoint_1.partial-00ff").mkdir()
    (tmp_path / "checkpoints" / "checkpoint_7").mkdir()  # no manifest: not one save_state completed
    fill(model, 0.0)
    acc.load_state()
    assert set(flat(model)) == {1.0}
    acc.save_state()
    assert ".checkpoint_1.partial-00ff" not in os.listdir(tmp_path / "checkpoints"), "a later save removes what crashes left"


def test_no_checkpoint_to_load(tmp_path):
    acc, _ = automatic(tmp_path)
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        acc.load_state()
    with pytest.raises(ValueError, match="Tried to find .*missing_dir but folder does not exist"):
        acc.load_state(tmp_path / "missing_dir")
    with pytest.raises(ValueError, match="No input_dir provided"):
        fresh().load_state()
    with pytest.raises(ValueError, match="output_dir"):
        fresh().save_state()


def test_saving_over_a_checkpoint_replaces_it_and_an_interrupted_replacement_recovers(tmp_path):
    acc = fresh()
    model = acc.prepare(net())
    target = tmp_path / "latest"
    fill(model, 1.0)
    acc.save_state(target)
    fill(model, 2.0)
    acc.save_state(target)
    assert os.listdir(tmp_path) == ["latest"]
    os.rename(target, tmp_path / ".latest.replaced-abc123")  # a crash between the two renames
    fill(model, 0.0)
    acc.load_state(target)
    assert set(flat(model)) == {2.0}
    fill(model, 3.0)
    acc.save_state(target)
    assert os.listdir(tmp_path) == ["latest"]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        acc.save_state(tmp_path / "mine")
    assert os.listdir(tmp_path / "mine") == ["notes.txt"]


def test_a_failed_save_changes_nothing(tmp_path):
    acc = fresh()
    model = acc.prepare(net())
    fill(model, 1.0)
    acc.save_state(tmp_path / "ckpt")
    before = {name: (tmp_path / "ckpt" / name).read_bytes() for name in os.listdir(tmp_path / "ckpt")}

    class Broken(Counter):
        def state_dict(self):
            raise RuntimeError("cannot serialise")

    acc.register_for_checkpointing(Broken())
    fill(model, 2.0)
    with pytest.raises(RuntimeError, match="cannot serialise"):
        acc.save_state(tmp_path / "ckpt")
    assert os.listdir(tmp_path) == ["ckpt"], "no staging directory is left behind"
    assert {name: (tmp_path / "ckpt" / name).read_bytes() for name in os.listdir(tmp_path / "ckpt")} == before
    assert acc.save_iteration == 1, "only completed saves advance the iteration"


def test_bad_checkpoints_are_named(tmp_path):
    acc = fresh()
    acc.prepare(net(), torch.optim.SGD(net().parameters(), lr=0.1))
    acc.register_for_checkpointing(Counter())
    folder = tmp_path / "ckpt"
    acc.save_state(folder)
    manifest = json.loads((folder / MANIFEST_NAME).read_text())

    with open(folder / "optimizer.bin", "r+b") as stream:
        stream.truncate(10)
    with pytest.raises(CheckpointError, match=r"optimizer\.bin is damaged or truncated"):
        acc.load_state(folder)
    acc.save_state(folder)

    (folder / "random_states_0.pkl").unlink()
    with pytest.raises(CheckpointError, match=r"random_states_0\.pkl is missing"):
        acc.load_state(folder)
    acc.save_state(folder)

    (folder / MANIFEST_NAME).write_text(json.dumps({**manifest, "num_processes": 4}))
    with pytest.raises(CheckpointError, match="saved by 4 processes and this run has 1"):
        acc.load_state(folder)
    acc.save_state(folder)

    (folder / "custom_checkpoint_1.pkl").write_bytes((folder / "custom_checkpoint_0.pkl").read_bytes())
    with pytest.raises(CheckpointError, match=r"custom_checkpoint_1\.pkl.*1 object"):
        acc.load_state(folder)
    (folder / "custom_checkpoint_1.pkl").unlink()
    acc.load_state(folder)

    (folder / MANIFEST_NAME).unlink()  # a directory not written by save_state: torch's errors, as under HF 1.15
    (folder / "optimizer.bin").unlink()
    with pytest.raises(FileNotFoundError, match=r"optimizer\.bin"):
        acc.load_state(folder)


def test_registered_objects_and_code_in_files(tmp_path):
    acc = fresh()
    with pytest.raises(ValueError, match=r"(?s)Item at index 0, `object`.*Item at index 1, `int`"):
        acc.register_for_checkpointing(object(), Counter(), 5)
    assert acc._custom_objects == [], "nothing is registered when one object is invalid"

    class Holder(Counter):
        def state_dict(self):
            return {"value": Counter(self.value)}

        def load_state_dict(self, state):
            self.value = state["value"].value

    holder = Holder(4)
    acc.register_for_checkpointing(holder)
    acc.save_state(tmp_path)
    holder.value = 0
    acc.load_state(tmp_path)  # registered objects' states load with weights_only=False, as in HF 1.15
    assert holder.value == 4


def test_pre_hooks_and_their_removal(tmp_path):
    acc = fresh()
    model = acc.prepare(net())
    seen = []

    def save_hook(models, weights, directory):
        seen.append(("save", models[0] is model, list(weights[0])))
        weights.clear()  # the hook saves the model its own way
        torch.save(models[0].state_dict(), os.path.join(directory, "custom_model.pt"))

    def load_hook(models, directory):
        seen.append(("load", os.path.isfile(os.path.join(directory, "custom_model.pt"))))
        models[0].load_state_dict(torch.load(os.path.join(directory, "custom_model.pt")))
        models.clear()

    handles = [acc.register_save_state_pre_hook(save_hook), acc.register_load_state_pre_hook(load_hook)]
    acc.save_state(tmp_path / "a")
    assert "model.safetensors" not in os.listdir(tmp_path / "a") and "custom_model.pt" in os.listdir(tmp_path / "a")
    fill(model, 5.0)
    acc.load_state(tmp_path / "a")
    assert seen == [("save", True, list(Net().state_dict())), ("load", True)] and flat(model) == flat(net())
    for handle in handles:
        handle.remove()
    acc.save_state(tmp_path / "b")
    acc.load_state(tmp_path / "b")
    assert len(seen) == 2 and "model.safetensors" in os.listdir(tmp_path / "b")


def test_unexpected_keyword_arguments(tmp_path):
    with pytest.raises(TypeError, match="unexpected"):
        fresh().save_state(tmp_path, zero_stage=3)
    acc = fresh()
    acc.save_state(tmp_path)
    with pytest.raises(TypeError, match="Unsupported optimizer map location passed"):
        acc.load_state(tmp_path, map_location="gpu")


# -- resumption -----------------------------------------------------------------------------


def loader_run(seed: int, seedable: bool) -> tuple[Accelerator, DataLoader]:
    torch.manual_seed(seed)
    acc = fresh(dataloader_config=DataLoaderConfiguration(use_seedable_sampler=seedable))
    return acc, acc.prepare(DataLoader(torch.arange(40), batch_size=4, shuffle=True))


def batches(loader) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


@pytest.mark.parametrize("seedable", [False, True], ids=["shuffle", "seedable"])
@pytest.mark.parametrize("epoch, at", [(0, 3), (1, 6), (1, 0), (2, 0)], ids=["epoch0", "epoch1", "epoch1-start", "boundary"])
def test_resume_yields_what_an_uninterrupted_run_yields(tmp_path, seedable, epoch, at):
    acc, loader = loader_run(0, seedable)
    uninterrupted = [batches(loader) for _ in range(4)]
    acc, loader = loader_run(0, seedable)
    for _ in range(epoch):
        batches(loader)
    iterator = iter(loader)
    seen = [next(iterator).tolist() for _ in range(at)]
    acc.save_state(tmp_path)
    acc, loader = loader_run(99, seedable)
    acc.load_state(tmp_path)
    rest = batches(acc.skip_first_batches(loader, at))
    assert seen + rest == uninterrupted[epoch]
    assert [batches(loader) for _ in range(epoch + 1, 4)] == uninterrupted[epoch + 1 :]


def test_resuming_twice_in_one_epoch(tmp_path):
    acc, loader = loader_run(0, False)
    uninterrupted = [batches(loader) for _ in range(2)]
    acc, loader = loader_run(0, False)
    iterator = iter(loader)
    first = [next(iterator).tolist() for _ in range(2)]
    acc.save_state(tmp_path / "a")
    acc, loader = loader_run(1, False)
    acc.load_state(tmp_path / "a")
    iterator = iter(acc.skip_first_batches(loader, 2))
    second = [next(iterator).tolist() for _ in range(3)]
    acc.save_state(tmp_path / "b")  # saved from inside the continued epoch: 5 batches done
    acc, loader = loader_run(2, False)
    acc.load_state(tmp_path / "b")
    assert loader.state_dict()["batches_in_epoch"] == 5
    rest = batches(acc.skip_first_batches(loader, 5))
    assert first + second + rest == uninterrupted[0] and batches(loader) == uninterrupted[1]


def test_a_loader_left_mid_epoch_is_continued_in_process():
    acc, loader = loader_run(0, False)
    whole = batches(loader)
    acc, loader = loader_run(0, False)
    iterator = iter(loader)
    head = [next(iterator).tolist() for _ in range(4)]
    assert head + batches(acc.skip_first_batches(loader, 4)) == whole
    assert loader.iteration == 1, "the loader moves on once its epoch was completed by the copy"


def test_resumed_training_draws_the_same_random_numbers(tmp_path):
    """The continued epoch's iterator does not draw its base seed from torch's RNG again."""
    acc, loader = loader_run(0, False)
    iterator = iter(loader)
    next(iterator)
    acc.save_state(tmp_path)
    expected = torch.rand(3).tolist()
    acc, loader = loader_run(5, False)
    acc.load_state(tmp_path)
    iter(acc.skip_first_batches(loader, 1)).__next__()
    assert torch.rand(3).tolist() == expected


def test_saving_and_loading_warn_about_nothing(tmp_path):
    acc = fresh()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        acc.save_state(tmp_path)
        acc.load_state(tmp_path)
