"""Unit tests of accelerate_ref's big-model loading: bad input gets a clear error and leaves nothing half-written.

Each error names the key, file or value at fault, and is raised before any
weight is loaded or any offload file is written.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import save_file

from accelerate_ref import dispatch_model, init_empty_weights, load_checkpoint_and_dispatch
from accelerate_ref.utils.modeling import get_max_memory, infer_auto_device_map, load_checkpoint_in_model
from conformance.cases.bigmodel_models import Net, built


def _checkpoint(tmp_path, state=None):
    state = state if state is not None else {k: v.contiguous() for k, v in built(width=4, depth=1).state_dict().items()}
    path = tmp_path / "model.safetensors"
    save_file(state, str(path), metadata={"format": "pt"})
    return path


def _empty():
    with init_empty_weights():
        return Net(width=4, depth=1)


def test_device_map_naming_a_missing_module_is_refused_with_its_name(tmp_path):
    checkpoint = _checkpoint(tmp_path)
    with pytest.raises(ValueError, match="blocks.7"):
        load_checkpoint_in_model(_empty(), checkpoint, device_map={"": "cpu", "blocks.7": "cpu"})
    with pytest.raises(ValueError, match="nothing"):
        dispatch_model(built(width=4, depth=1), {"": "cpu", "nothing": "cpu"})


def test_budget_string_that_does_not_parse_names_the_value():
    with pytest.raises(ValueError, match="12 parsecs"):
        get_max_memory({0: "12 parsecs"})
    with pytest.raises(ValueError, match="'gpu'"):
        infer_auto_device_map(built(width=4, depth=1), {"gpu": "1GB"})


def test_missing_and_unexpected_weights_are_named(tmp_path):
    state = {k: v.contiguous() for k, v in built(width=4, depth=1).state_dict().items()}
    del state["head.weight"]
    state["extra.weight"] = torch.ones(2)
    checkpoint = _checkpoint(tmp_path, state)
    with pytest.raises(ValueError, match=r"head\.weight.*extra\.weight"):
        load_checkpoint_in_model(_empty(), checkpoint, device_map={"": "cpu"}, strict=True)
    with pytest.warns(UserWarning, match="head.weight"):
        load_checkpoint_in_model(_empty(), checkpoint, device_map={"": "cpu"})


def test_folder_with_two_index_files_is_refused(tmp_path):
    for name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        (tmp_path / name).write_text(json.dumps({"weight_map": {}}))
    with pytest.raises(ValueError, match="several .index.json"):
        load_checkpoint_in_model(_empty(), tmp_path, device_map={"": "cpu"})


def test_disk_entries_without_offload_folder_are_refused_before_anything_is_written(tmp_path):
    checkpoint = _checkpoint(tmp_path)
    model = _empty()
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(ValueError, match=r"\['head'\].*offload_folder"):
        load_checkpoint_in_model(model, checkpoint, device_map={"embed": "cpu", "blocks": "cpu", "head": "disk"})
    assert sorted(os.listdir(tmp_path)) == before
    assert model.embed.weight.is_meta, "nothing was loaded"
    with pytest.raises(ValueError, match="offload_dir"):
        dispatch_model(built(width=4, depth=1), {"embed": "cpu", "blocks": "cpu", "head": "disk"})


def test_shape_mismatch_in_a_later_shard_writes_no_offload_file(tmp_path):
    state = {k: v.contiguous() for k, v in built(width=4, depth=1).state_dict().items()}
    names = sorted(state)
    first, second = names[: len(names) // 2], names[len(names) // 2 :]
    save_file({k: state[k] for k in first}, str(tmp_path / "a.safetensors"))
    wrong = {k: state[k] for k in second}
    wrong[second[0]] = torch.zeros(7)
    save_file(wrong, str(tmp_path / "b.safetensors"))
    index = {"weight_map": {**dict.fromkeys(first, "a.safetensors"), **dict.fromkeys(second, "b.safetensors")}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    offload = tmp_path / "offload"
    with pytest.raises(ValueError, match=second[0]):
        load_checkpoint_in_model(_empty(), tmp_path, device_map={"": "disk"}, offload_folder=offload)
    assert not offload.exists() or not os.listdir(offload)


def test_unknown_strategy_names_the_choices(tmp_path):
    with pytest.raises(ValueError, match="balanced_low_0"):
        load_checkpoint_and_dispatch(_empty(), _checkpoint(tmp_path), device_map="fastest")
