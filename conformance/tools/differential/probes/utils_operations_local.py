"""Probes of ``accelerate.utils.operations``' local helpers (no communication, one process): walking nested
structures, moving them, measuring and converting them, and each helper's refusals and their messages.

The collectives (gather, reduce, broadcast, padding across processes, debug mode) are in ``utils_operations``.
"""

from __future__ import annotations

import functools
import pickle
from collections import OrderedDict, namedtuple
from typing import Any

import torch

from ..probe import Api, probe

AREA = "utils.operations"
OPS = "utils.operations"

Pair = namedtuple("Pair", ["first", "second"])


class Movable:
    """A batch object that moves itself: ``.to`` takes ``non_blocking``."""

    def __init__(self) -> None:
        self.moves: list[tuple[Any, bool]] = []

    def to(self, device: Any, non_blocking: bool = False) -> "Movable":
        self.moves.append((str(device), non_blocking))
        return self


class MovableWithoutNonBlocking:
    """A batch object whose ``.to`` takes only the device (send_to_device retries without ``non_blocking``)."""

    def __init__(self) -> None:
        self.moves: list[str] = []

    def to(self, device: Any) -> "MovableWithoutNonBlocking":
        self.moves.append(str(device))
        return self


class RefusesToMove:
    """A ``.to`` that fails an assertion (what torch_npu does for an integer device)."""

    def to(self, device: Any, non_blocking: bool = False) -> None:
        raise AssertionError(f"cannot move to {device!r}")


def _double(tensor: torch.Tensor, factor: int = 2, offset: int = 0) -> torch.Tensor:
    return tensor * factor + offset


def _nested() -> dict[str, Any]:
    return {"a": torch.arange(4.0).reshape(2, 2), "b": [torch.ones(2, 3), (torch.tensor([1, 2]), "text")],
            "c": Pair(torch.zeros(2), 7)}


@probe(AREA)
def predicates(api: Api) -> None:
    info = api.get("utils.dataclasses.TensorInformation")(shape=torch.Size([2]), dtype=torch.float32)
    for label, value in (("a tensor", torch.ones(1)), ("a list", [torch.ones(1)]), ("a parameter",
                         torch.nn.Parameter(torch.ones(1)))):
        api.call(f"is_torch_tensor: {label}", f"{OPS}.is_torch_tensor", value)
    api.call("is_tensor_information: one", f"{OPS}.is_tensor_information", info)
    api.call("is_tensor_information: a tensor", f"{OPS}.is_tensor_information", torch.ones(1))
    api.call("is_namedtuple: a namedtuple", f"{OPS}.is_namedtuple", Pair(1, 2))
    api.call("is_namedtuple: a tuple", f"{OPS}.is_namedtuple", (1, 2))
    api.call("is_namedtuple: a list", f"{OPS}.is_namedtuple", [1, 2])
    api.call("is_torch_xpu_tensor", f"{OPS}.is_torch_xpu_tensor", torch.ones(1))


@probe(AREA)
def honor_type(api: Api) -> None:
    for label, value in (("a list", [1, 2]), ("a tuple", (1, 2)), ("a namedtuple", Pair(1, 2))):
        api.call(label, f"{OPS}.honor_type", value, (item * 10 for item in value))
    api.call("a namedtuple with too few items", f"{OPS}.honor_type", Pair(1, 2), iter([5]))


@probe(AREA)
def recursively_apply(api: Api) -> None:
    apply = f"{OPS}.recursively_apply"
    api.call("nested", apply, _double, _nested())
    api.call("args and kwargs", apply, _double, [torch.ones(2)], 3, offset=1)
    api.call("an OrderedDict", apply, _double, OrderedDict(x=torch.ones(1), y=torch.zeros(1)))
    api.call("a test_type", apply, lambda value: value + 1, {"a": 1, "b": [2.0, "x"]},
             test_type=lambda value: isinstance(value, (int, float)))
    api.call("error_on_other_type", apply, _double, {"a": torch.ones(1), "b": ["text"]}, error_on_other_type=True)
    api.call("error_on_other_type, a partial", apply, functools.partial(_double, factor=3), ["text"],
             error_on_other_type=True)
    api.call("a bare leaf", apply, _double, torch.ones(2))
    api.call("a bare other leaf", apply, _double, 5)


@probe(AREA)
def send_to_device(api: Api) -> None:
    send = f"{OPS}.send_to_device"
    api.call("nested to cpu", send, _nested(), "cpu")
    api.call("non_blocking", send, [torch.ones(2)], torch.device("cpu"), non_blocking=True)
    batch = {"x": torch.ones(2), "keep": torch.zeros(1), "inner": {"keep": torch.ones(1), "y": torch.ones(1)}}
    api.call("skip_keys a string", send, batch, "cpu", skip_keys="keep")
    api.call("skip_keys a list", send, batch, "cpu", skip_keys=["keep", "y"])
    movable, plain = Movable(), MovableWithoutNonBlocking()
    api.observe("an object with .to", lambda: send_to_device_moves(api, movable, non_blocking=True))
    api.observe("an object with .to without non_blocking", lambda: send_to_device_moves(api, plain, non_blocking=True))
    api.call("an object whose .to fails an assertion", send, RefusesToMove(), 0)
    api.call("an unknown device", send, torch.ones(1), "nodevice")
    api.call("npu", send, torch.ones(1), "npu")
    api.call("other leaves", send, [1, "a", None], "cpu")
    api.call("a tuple of tensors", send, (torch.ones(1), Pair(torch.ones(1), 3)), "cpu")


def send_to_device_moves(api: Api, movable: Any, **kwargs: Any) -> list:
    returned = api.get(f"{OPS}.send_to_device")(movable, "cpu", **kwargs)
    return [returned is movable, movable.moves]


@probe(AREA, families=("cpu", "cuda"))
def send_to_device_placement(api: Api) -> None:
    """Where tensors land: the mock GPUs take HF's CUDA path (an int index, ``"cuda"``)."""
    api.partial_state()
    send = f"{OPS}.send_to_device"
    api.call("to the state's device", send, {"x": torch.ones(2)}, api.get("PartialState")().device)
    api.call("to index 0", send, [torch.ones(2)], 0)
    api.call("to cpu", send, torch.ones(2), "cpu")


@probe(AREA)
def structure_and_shapes(api: Api) -> None:
    structure = api.call("get_data_structure", f"{OPS}.get_data_structure", _nested())
    api.call("get_shape", f"{OPS}.get_shape", _nested())
    api.call("get_shape of a bare tensor", f"{OPS}.get_shape", torch.ones(2, 3))
    initialize = api.get(f"{OPS}.initialize_tensors")
    api.observe("initialize_tensors: shapes and dtypes", lambda: api.get(f"{OPS}.get_data_structure")(
        initialize(structure)))
    api.call("initialize_tensors of no TensorInformation", f"{OPS}.initialize_tensors", [1, "a"])


@probe(AREA)
def find_batch_size(api: Api) -> None:
    for name in ("find_batch_size", "ignorant_find_batch_size"):
        call = f"{OPS}.{name}"
        api.call(f"{name}: a tensor", call, torch.ones(3, 2))
        api.call(f"{name}: nested", call, {"x": [torch.ones(5)], "y": torch.ones(2)})
        api.call(f"{name}: a tuple", call, (torch.ones(4), torch.ones(1)))
        for label, value in (("an empty list", []), ("an empty tuple", ()), ("an empty dict", {}),
                             ("a list holding an empty dict", [{}]), ("a string", "abc"), ("an int", 3),
                             ("a list of ints", [1, 2])):
            api.call(f"{name}: {label}", call, value)
        api.call(f"{name}: a 0-d tensor", call, torch.tensor(1.0))


@probe(AREA)
def listify(api: Api) -> None:
    api.call("nested", f"{OPS}.listify", {"a": torch.tensor([[1, 2]]), "b": [torch.tensor(1.5), "x"]})
    api.call("bf16", f"{OPS}.listify", torch.tensor([1.5, 2.0], dtype=torch.bfloat16))
    api.call("requires grad", f"{OPS}.listify", torch.ones(2, requires_grad=True))


@probe(AREA)
def slice_tensors(api: Api) -> None:
    data = {"a": torch.arange(6).reshape(3, 2), "b": [torch.arange(4), "x"]}
    api.call("a slice", f"{OPS}.slice_tensors", data, slice(0, 2))
    api.call("an index", f"{OPS}.slice_tensors", data, 1)
    api.call("process arguments ignored", f"{OPS}.slice_tensors", data, slice(1, None), 0, 2)
    api.call("an out-of-range index", f"{OPS}.slice_tensors", torch.arange(2), 5)


@probe(AREA)
def concatenate(api: Api) -> None:
    call = f"{OPS}.concatenate"
    api.call("tensors", call, [torch.ones(1, 2), torch.zeros(2, 2)])
    api.call("dim 1", call, [torch.ones(2, 1), torch.zeros(2, 2)], dim=1)
    api.call("nested", call, [{"a": (torch.ones(1), [torch.ones(2)])}, {"a": (torch.zeros(1), [torch.zeros(2)])}])
    api.call("namedtuples", call, [Pair(torch.ones(1), torch.ones(1)), Pair(torch.zeros(1), torch.zeros(1))])
    api.call("one non-tensor", call, ["text"])
    api.call("a tuple of one non-tensor", call, (3,))
    api.call("two non-tensors", call, [1, 2])
    api.call("a one-character string", call, "a")
    api.call("an empty list", call, [])
    api.call("mismatched shapes", call, [torch.ones(1, 2), torch.ones(1, 3)])


@probe(AREA)
def pad_input_tensors(api: Api) -> None:
    call = f"{OPS}.pad_input_tensors"
    for batch_size, processes in ((3, 4), (5, 4), (6, 4), (4, 4), (2, 3)):
        api.call(f"{batch_size} on {processes}", call, torch.arange(1, batch_size + 1), batch_size, processes)
    api.call("nested", call, {"x": torch.ones(3, 2), "y": [torch.arange(3)]}, 3, 2)
    api.call("dim 1", call, torch.ones(2, 3), 3, 2, dim=1)
    api.call("a non-tensor", call, [torch.ones(3), "x"], 3, 2)


@probe(AREA)
def convert_to_fp32(api: Api) -> None:
    data = {"h": torch.ones(2, dtype=torch.float16), "b": [torch.ones(1, dtype=torch.bfloat16)],
            "f": torch.ones(1, dtype=torch.float64), "i": torch.ones(1, dtype=torch.int32), "s": "x"}
    api.call("nested", f"{OPS}.convert_to_fp32", data)
    api.call("a bare half tensor", f"{OPS}.convert_to_fp32", torch.tensor([0.5], dtype=torch.float16))


def _half_forward(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """A forward whose outputs are half precision."""
    return {"out": x.half(), "mask": x > 0}


@probe(AREA)
def convert_outputs_to_fp32(api: Api) -> None:
    forward = api.call("wrap", f"{OPS}.convert_outputs_to_fp32", _half_forward)
    api.observe("call the wrapped forward", forward, torch.tensor([1.0, -1.0]))
    api.observe("its __wrapped__", lambda: [type(forward.__wrapped__).__name__, forward.__wrapped__.__name__,
                                            forward.__wrapped__.model_forward is _half_forward])
    api.observe("pickle the wrapped forward", pickle.dumps, forward.__wrapped__)
    converter = api.call("ConvertOutputsToFp32", f"{OPS}.ConvertOutputsToFp32", _half_forward)
    api.observe("call ConvertOutputsToFp32", converter, torch.tensor([2.0]))
    api.observe("its name and doc", lambda: [converter.__name__, converter.__doc__, converter.__wrapped__ is _half_forward])
    api.observe("pickle ConvertOutputsToFp32", pickle.dumps, converter)


@probe(AREA)
def find_device(api: Api) -> None:
    call = f"{OPS}.find_device"
    api.call("a tensor", call, torch.ones(1))
    api.call("nested", call, {"a": "x", "b": [None, (torch.ones(1, device="meta"),)], "c": torch.ones(1)})
    api.call("no tensor", call, {"a": [1, "x"]})
    api.call("an empty list", call, [])
    api.call("a module", call, torch.nn.Linear(1, 1))


@probe(AREA)
def gathered_parameters_outside_deepspeed(api: Api) -> None:
    api.accelerator()
    parameters = list(torch.nn.Linear(2, 1).parameters())

    def enter() -> str:
        with api.get(f"{OPS}.GatheredParameters")(parameters, modifier_rank=0):
            return "entered"

    api.observe("a no-op without DeepSpeed", enter)
