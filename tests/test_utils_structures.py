"""Catalog: ops.recursively_apply, ops.send_to_device, ops.slice_tensors, ops.concatenate,
ops.listify, ops.convert_to_fp32 (local helpers on nested structures, one process)."""

import pickle
from collections import OrderedDict, namedtuple

import pytest
import torch

from accelerate_ref.utils import (
    ConvertOutputsToFp32,
    TensorInformation,
    concatenate,
    convert_outputs_to_fp32,
    convert_to_fp32,
    find_batch_size,
    find_device,
    get_data_structure,
    honor_type,
    ignorant_find_batch_size,
    initialize_tensors,
    is_namedtuple,
    is_torch_tensor,
    listify,
    pad_input_tensors,
    recursively_apply,
    send_to_device,
    slice_tensors,
)
from accelerate_ref.utils.operations import get_shape

Point = namedtuple("Point", "x y")


def nested():
    return {"a": torch.arange(4), "b": [torch.ones(2, 2), (torch.zeros(3), "label")], "c": Point(torch.ones(1), 7)}


def test_recursively_apply_keeps_structure_and_types():
    """ops.recursively_apply: applied to tensors; containers rebuilt with their types; others kept."""
    data = OrderedDict(nested())
    result = recursively_apply(lambda t, k, add: t * k + add, data, 2, add=1)
    assert type(result) is OrderedDict and list(result) == ["a", "b", "c"]
    assert torch.equal(result["a"], torch.arange(4) * 2 + 1)
    assert isinstance(result["b"], list) and isinstance(result["b"][1], tuple)
    assert result["b"][1][1] == "label"
    assert isinstance(result["c"], Point) and result["c"].y == 7 and torch.equal(result["c"].x, torch.full((1,), 3.0))


def test_recursively_apply_test_type():
    assert recursively_apply(lambda s: s.upper(), ["a", ("b", 1)], test_type=lambda o: isinstance(o, str)) == [
        "A", ("B", 1),
    ]


def test_recursively_apply_error_on_other_type_names_type_and_function():
    """ops.recursively_apply: error_on_other_type=True raises, naming the type and function (HF 1.15's words)."""

    def double(tensor):
        return tensor * 2

    with pytest.raises(TypeError) as error:
        recursively_apply(double, {"x": [torch.ones(1), {"y": 3.5}]}, error_on_other_type=True)
    message = str(error.value)
    assert message == ("Unsupported types (<class 'float'>) passed to `double`. Only nested list/tuple/dicts of "
                       "objects that are valid for `is_torch_tensor` should be passed.")


def test_honor_type_and_namedtuple():
    assert honor_type((1, 2), iter([3, 4])) == (3, 4)
    assert honor_type(Point(1, 2), iter([3, 4])) == Point(3, 4)
    assert honor_type([1], (x for x in [5])) == [5]
    assert is_namedtuple(Point(1, 2)) and not is_namedtuple((1, 2))
    assert is_torch_tensor(torch.ones(1)) and not is_torch_tensor([1.0])


def test_send_to_device_nested_and_skip_keys():
    """ops.send_to_device: tensors moved, skip_keys left alone, non-tensor leaves untouched."""
    moved_to = []

    class Movable:
        def to(self, device, non_blocking=False):
            moved_to.append((device, non_blocking))
            return "moved"

    class OldStyle:
        def to(self, device):
            return f"old-style to {device}"

    meta = torch.device("meta")
    data = {"x": torch.ones(2), "keep": torch.ones(1), "inner": {"keep": torch.ones(1), "y": [torch.ones(1), 3]},
            "obj": Movable(), "old": OldStyle(), "text": "hi"}
    result = send_to_device(data, meta, non_blocking=True, skip_keys="keep")
    assert result["x"].device == meta and result["inner"]["y"][0].device == meta
    assert result["keep"] is data["keep"] and result["inner"]["keep"] is data["inner"]["keep"]
    assert result["inner"]["y"][1] == 3 and result["text"] == "hi"
    assert result["obj"] == "moved" and moved_to == [(meta, True)]
    assert result["old"] == "old-style to meta"
    both = send_to_device({"a": torch.ones(1), "b": torch.ones(1)}, meta, skip_keys=["a", "b"])
    assert both["a"].device.type == "cpu" and both["b"].device.type == "cpu"


def test_get_data_structure_and_initialize_tensors():
    data = {"a": torch.ones(2, 3, dtype=torch.float16), "b": [torch.arange(4)]}
    structure = get_data_structure(data)
    assert structure == {"a": TensorInformation(torch.Size([2, 3]), torch.float16),
                         "b": [TensorInformation(torch.Size([4]), torch.int64)]}
    rebuilt = initialize_tensors(structure)
    assert rebuilt["a"].shape == (2, 3) and rebuilt["a"].dtype == torch.float16 and rebuilt["b"][0].shape == (4,)
    assert get_shape(data) == {"a": [2, 3], "b": [[4]]}


def test_find_batch_size():
    assert find_batch_size({"ids": [torch.ones(5, 2)], "mask": torch.ones(3)}) == 5
    assert find_batch_size((torch.ones(7),)) == 7
    with pytest.raises(ValueError, match="empty"):
        find_batch_size([])
    with pytest.raises(TypeError, match="str"):
        find_batch_size(["text"])
    assert ignorant_find_batch_size(["text"]) is None and ignorant_find_batch_size({}) is None


def test_find_device():
    assert find_device(["x", {"a": torch.ones(1, device="meta")}]) == torch.device("meta")
    assert find_device({"a": [1, "b"]}) is None


def test_listify():
    """ops.listify: tensors become numbers / lists, bf16 included."""
    data = {"a": torch.tensor([[1, 2], [3, 4]]), "b": (torch.tensor(2.5, dtype=torch.bfloat16), "s")}
    assert listify(data) == {"a": [[1, 2], [3, 4]], "b": (2.5, "s")}


def test_slice_tensors():
    """ops.slice_tensors: the slice is applied to every tensor, other leaves kept."""
    data = {"a": torch.arange(6), "b": [torch.arange(12).view(6, 2), "meta"]}
    result = slice_tensors(data, slice(1, 3))
    assert result["a"].tolist() == [1, 2] and result["b"][0].tolist() == [[2, 3], [4, 5]] and result["b"][1] == "meta"


def test_concatenate():
    """ops.concatenate: lists of nested tensors concatenated on dim, structure kept."""
    batches = [{"x": torch.ones(2, 3), "y": [torch.zeros(2)]}, {"x": torch.zeros(1, 3), "y": [torch.ones(4)]}]
    result = concatenate(batches)
    assert result["x"].shape == (3, 3) and result["y"][0].tolist() == [0, 0, 1, 1, 1, 1]
    assert concatenate([torch.ones(2, 1), torch.ones(2, 2)], dim=1).shape == (2, 3)
    assert concatenate([Point(torch.ones(1), torch.ones(1))] * 2).x.shape == (2,)
    assert concatenate(["only"]) == "only"
    with pytest.raises(TypeError, match="str"):
        concatenate(["a", "b"])


def test_convert_to_fp32():
    """ops.convert_to_fp32: fp16/bf16 leaves become fp32, other leaves untouched."""
    data = {"h": torch.ones(1, dtype=torch.float16), "b": [torch.ones(1, dtype=torch.bfloat16)],
            "i": torch.ones(1, dtype=torch.int64), "d": torch.ones(1, dtype=torch.float64), "s": "x"}
    result = convert_to_fp32(data)
    assert result["h"].dtype == torch.float32 and result["b"][0].dtype == torch.float32
    assert result["i"] is data["i"] and result["d"] is data["d"] and result["s"] == "x"


def test_convert_outputs_to_fp32_wraps_forward():
    """ops.convert_to_fp32: convert_outputs_to_fp32 wraps a forward; the wrapper refuses pickling."""

    def forward(x, scale=1):
        """The forward."""
        return {"out": (x * scale).half(), "n": 3}

    wrapped = convert_outputs_to_fp32(forward)
    result = wrapped(torch.ones(2), scale=2)
    assert result["out"].dtype == torch.float32 and result["out"].tolist() == [2.0, 2.0] and result["n"] == 3
    assert isinstance(wrapped.__wrapped__, ConvertOutputsToFp32)
    assert wrapped.__wrapped__.model_forward is forward and wrapped.__wrapped__.__doc__ == "The forward."
    with pytest.raises(pickle.PicklingError, match="unwrap"):
        pickle.dumps(wrapped.__wrapped__)


def test_pad_input_tensors_repeats_last_entry():
    assert pad_input_tensors(torch.arange(3), 3, 4).tolist() == [0, 1, 2, 2]
    assert pad_input_tensors(torch.arange(5), 5, 4).tolist() == [0, 1, 2, 3, 4, 4, 4, 4]
    assert pad_input_tensors(torch.arange(6), 6, 4).shape == (8,)
    assert pad_input_tensors(torch.arange(8), 8, 4).tolist() == list(range(8))
    padded = pad_input_tensors({"x": torch.arange(6).view(2, 3)}, 3, 2, dim=1)
    assert padded["x"].tolist() == [[0, 1, 2, 2], [3, 4, 5, 5]]
    with pytest.raises(TypeError, match="str"):
        pad_input_tensors(["a"], 1, 2)
