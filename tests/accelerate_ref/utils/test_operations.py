"""Catalog: gather.*, gather_object.*, reduce.*, pad.*, broadcast.from_process,
broadcast_object_list.in_place, debug.shape_mismatch.

Single-process tests run here; multi-rank ones run `_collective_checks` on every
rank of simulated worlds (1, 2, 3, 4, 2 machines x 2) through `simulators.run`.
Assertions run inside the ranks: a failed one fails the launch with the rank's
traceback.

Catalog: ops.recursively_apply, ops.send_to_device, ops.slice_tensors, ops.concatenate,
ops.listify, ops.convert_to_fp32 (local helpers on nested structures, one process).
"""

import os
import pickle
import warnings
from collections import OrderedDict, namedtuple

import pytest
import torch

import simulators
from accelerate_ref import Accelerator, AcceleratorState, GradientState
from accelerate_ref.local_sgd import LocalSGD
from accelerate_ref.utils import (
    CannotPadNestedTensorWarning,
    ConvertOutputsToFp32,
    DistributedOperationException,
    DistributedType,
    TensorInformation,
    broadcast,
    broadcast_object_list,
    concatenate,
    convert_outputs_to_fp32,
    convert_to_fp32,
    copy_tensor_to_devices,
    find_batch_size,
    find_device,
    gather,
    gather_object,
    get_data_structure,
    honor_type,
    ignorant_find_batch_size,
    initialize_tensors,
    is_namedtuple,
    is_torch_tensor,
    listify,
    pad_across_processes,
    pad_input_tensors,
    recursively_apply,
    reduce,
    send_to_device,
    slice_tensors,
)
from accelerate_ref.utils.operations import get_shape

Pair = namedtuple("Pair", "first second")
LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def single_process(monkeypatch):
    """A fresh one-process state, whatever state earlier tests left behind."""
    from accelerate_ref.state import PartialState

    for name in LAUNCH_ENV:
        monkeypatch.delenv(name, raising=False)
    PartialState._reset_state()
    state = PartialState()
    assert state.distributed_type == DistributedType.NO and state.num_processes == 1
    yield state
    PartialState._reset_state()


def test_gather_single_process(single_process):
    """gather.first_dim, gather.scalar, gather.nested at world 1."""
    tensor = torch.arange(3)
    assert gather(tensor) is tensor
    scalar = gather(torch.tensor(5.0))
    assert scalar.shape == (1,) and scalar.tolist() == [5.0]
    result = gather({"a": [torch.ones(2)], "b": Pair(torch.zeros(1), torch.tensor(1))})
    assert result["a"][0].tolist() == [1.0, 1.0] and isinstance(result["b"], Pair)
    assert result["b"].second.shape == (1,)


def test_non_tensor_leaves_on_one_process(single_process):
    assert gather({"a": "text", "b": torch.tensor(2)})["a"] == "text"  # HF 1.15: one process returns it as it is
    with pytest.raises(TypeError, match=r"<class 'int'>\) passed to `_reduce_across_processes`\. Only"):
        reduce([torch.ones(1), [3]], "sum")  # HF 1.15's words, naming its inner function
    assert broadcast([None]) == [None]  # one process: HF returns any input as it is
    with pytest.raises(TypeError, match="`_pad_across_processes`"):
        pad_across_processes({"x": 1.0})


def test_gather_object_single_process(single_process):
    """gather_object.nested, gather_object.structures at world 1."""
    assert gather_object([1, {"x": 2}]) == [1, {"x": 2}]
    assert gather_object(("a", "b")) == ("a", "b")  # HF 1.15: one process returns the object as it is
    assert gather_object({"k": 0}) == [{"k": 0}]  # except a dict (catalog gather_object.structures)
    assert gather_object(7) == 7


def test_reduce_single_process(single_process):
    """reduce.mean, reduce.none, reduce.nested at world 1."""
    tensor = torch.tensor([1.0, 2.0])
    summed = reduce(tensor, "sum")
    assert summed.tolist() == [1.0, 2.0] and summed is not tensor
    assert reduce(tensor).tolist() == [1.0, 2.0]
    assert reduce(tensor, "sum", scale=3.0).tolist() == [1.0, 2.0]  # scale: "only valid on XLA" (the documents)
    assert reduce(tensor, "none") is tensor
    assert reduce(tensor, "".join(["no", "ne"])) is tensor, "a name built at run time (from a config) is compared by value"
    assert reduce({"a": [tensor]}, "mean")["a"][0].tolist() == [1.0, 2.0]


@pytest.mark.parametrize("reduction", ["min", "SUM", "avg", None])  # "max" is valid (A v1.x)
def test_reduce_takes_any_name_on_one_process(single_process, reduction):
    """HF 1.15 checks no reduction name: on one process the input comes back as a copy."""
    tensor = torch.ones(1)
    reduced = reduce(tensor, reduction)
    assert reduced.tolist() == [1.0] and reduced is not tensor


def test_broadcast_single_process(single_process):
    """broadcast.from_process, broadcast_object_list.in_place at world 1."""
    tensor = torch.arange(3)
    assert broadcast(tensor) is tensor
    objects = [1, "two"]
    assert broadcast_object_list(objects) is objects and objects == [1, "two"]
    assert broadcast(tensor, from_process=1) is tensor  # HF 1.15: no rank to check against on one process
    assert broadcast_object_list(objects, from_process=-1) is objects


def test_pad_across_processes_single_process(single_process):
    tensor = torch.arange(3)
    assert pad_across_processes(tensor) is tensor
    assert pad_across_processes({"s": torch.tensor(1)}, dim=0)["s"].shape == ()


# ---------------------------------------------------------------------------
# Multi-rank
# ---------------------------------------------------------------------------
def _check_gather(r, n):
    assert gather(torch.tensor([r])).tolist() == list(range(n))  # gather.doc_example
    block = gather(torch.full((2, 3), r))  # gather.first_dim
    assert block.shape == (2 * n, 3) and block[:, 0].tolist() == [i for i in range(n) for _ in range(2)]
    scalar = gather(torch.tensor(float(r)))  # gather.scalar
    assert scalar.shape == (n,) and scalar.tolist() == [float(i) for i in range(n)]
    transposed = torch.arange(6).view(2, 3).t() + 10 * r  # not contiguous
    assert gather(transposed).tolist() == [row for i in range(n) for row in (torch.arange(6).view(2, 3).t() + 10 * i).tolist()]
    for dtype in (torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.uint8, torch.bool):
        gathered = gather(torch.tensor([r % 2], dtype=dtype))
        assert gathered.dtype == dtype and gathered.tolist() == torch.tensor([i % 2 for i in range(n)], dtype=dtype).tolist()
    nested = gather({"a": torch.tensor([r]), "b": [torch.tensor([[r, r]]), (torch.tensor(r),)], "c": Pair(torch.tensor([r]), torch.tensor([-r]))})
    assert list(nested) == ["a", "b", "c"]  # gather.nested
    assert nested["a"].tolist() == list(range(n))
    assert nested["b"][0].tolist() == [[i, i] for i in range(n)] and isinstance(nested["b"][1], tuple)
    assert nested["b"][1][0].tolist() == list(range(n))
    assert isinstance(nested["c"], Pair) and nested["c"].second.tolist() == [-i for i in range(n)]
    if n == 1:
        assert gather({"a": torch.ones(1), "b": "text"})["b"] == "text"  # one process: as it is (HF 1.15)
        return
    try:
        gather({"a": torch.ones(1), "b": "text"})
    except TypeError as error:  # HF 1.15's words, naming its inner function
        assert "Unsupported types (<class 'str'>) passed to `_gpu_gather_one`" in str(error)
    else:
        raise AssertionError("gather of a str leaf did not raise TypeError")


def _check_gather_object(r, n):
    assert gather_object([r]) == list(range(n))  # gather_object.nested
    assert gather_object([[r, r]]) == [[i, i] for i in range(n)]
    assert gather_object([f"s{r}", {"r": r}]) == [x for i in range(n) for x in (f"s{i}", {"r": i})]
    assert gather_object({"k": r}) == [{"k": i} for i in range(n)]  # gather_object.structures
    assert gather_object({"outer": {"inner": [r]}}) == [{"outer": {"inner": [i]}} for i in range(n)]
    if n == 1:
        assert gather_object(r) == r
    else:
        try:  # HF 1.15 iterates every rank's object
            gather_object(r)
        except TypeError as error:
            assert "'int' object is not iterable" in str(error)
        else:
            raise AssertionError("gather_object(int) did not raise TypeError")


def _check_reduce(r, n):
    doc = reduce(torch.arange(n) + 1 + 2 * r, "sum")  # reduce.doc_example
    expected_sum = [sum(j + 1 + 2 * i for i in range(n)) for j in range(n)]
    assert doc.tolist() == expected_sum
    if n == 2:
        assert doc.tolist() == [4, 6]
    values = torch.tensor([float(r), 2.0 * r + 1])
    total = [sum(float(i) for i in range(n)), sum(2.0 * i + 1 for i in range(n))]
    assert reduce(values).tolist() == pytest.approx([t / n for t in total])  # reduce.mean (default)
    assert reduce(values, "mean").tolist() == pytest.approx([t / n for t in total])
    assert reduce(torch.tensor([float(r), 1.0]), "mean").tolist() == pytest.approx([sum(range(n)) / n, 1.0])
    if n > 1:  # an integer mean cannot be stored in place (HF 1.15: torch's RuntimeError)
        with pytest.raises(RuntimeError, match="can't be cast"):
            reduce(torch.tensor([r, 1]), "mean")
    assert reduce(values, "sum", scale=0.5).tolist() == pytest.approx(total)  # scale: "only valid on XLA"
    assert reduce(values, "none") is values  # reduce.none
    assert values.tolist() == [float(r), 2.0 * r + 1]
    nested = reduce({"x": [torch.tensor([r])], "y": (torch.tensor(1.0),)}, "sum")  # reduce.nested
    assert nested["x"][0].tolist() == [sum(range(n))] and nested["y"][0].item() == float(n)
    assert reduce(values, "max").tolist() == [float(n - 1), 2.0 * (n - 1) + 1]  # "max": listed by A v1.x
    assert reduce(values, "min").tolist() == pytest.approx(total)  # HF 1.15: a name it does not know sums


def _check_broadcast(r, n):
    for source in range(n):  # broadcast.from_process
        tensor = torch.tensor([r, r])
        result = broadcast(tensor, from_process=source)
        assert result is tensor and tensor.tolist() == [source, source]
        nested = broadcast({"a": [torch.full((2, 2), float(r))], "b": torch.tensor(r)}, from_process=source)
        assert nested["a"][0].tolist() == [[float(source)] * 2] * 2 and nested["b"].item() == source
    transposed = (torch.arange(4).view(2, 2) + r).t()
    assert broadcast(transposed, from_process=n - 1).tolist() == (torch.arange(4).view(2, 2) + n - 1).t().tolist()
    objects = [r, f"rank{r}", {"r": [r]}]  # broadcast_object_list.in_place
    assert broadcast_object_list(objects, from_process=n - 1) is objects
    assert objects == [n - 1, f"rank{n - 1}", {"r": [n - 1]}]
    assert broadcast_object_list([r, None]) == [0, None]


def _check_pad(r, n):
    padded = pad_across_processes(torch.arange(r + 1))  # pad.doc_example
    assert padded.shape == (n,) and padded.tolist() == list(range(r + 1)) + [0] * (n - 1 - r)
    first = pad_across_processes(torch.arange(r + 1) + 1, pad_index=-1, pad_first=True)  # pad.pad_first_index_dim
    assert first.tolist() == [-1] * (n - 1 - r) + list(range(1, r + 2))
    wide = pad_across_processes({"m": [torch.ones(2, r + 1)]}, dim=1, pad_index=7)
    assert wide["m"][0].shape == (2, n) and wide["m"][0][:, r + 1:].eq(7).all()
    negative = pad_across_processes(torch.ones(2, r + 1), dim=-1)
    assert negative.shape == (2, n)
    assert pad_across_processes(torch.ones(3, 2), dim=0).shape == (3, 2)
    gathered = gather(pad_across_processes(torch.arange(r + 1)))
    assert gathered.shape == (n * n,)


def _check_debug_mode(r, n):
    """debug.shape_mismatch: every rank raises, naming every rank's shape; equal shapes still work."""
    from accelerate_ref.state import PartialState

    assert PartialState().debug is True
    assert gather(torch.tensor([r])).tolist() == list(range(n))
    assert reduce(torch.ones(2), "sum").tolist() == [float(n)] * 2
    cases = [
        ("gather", lambda: gather(torch.ones(r + 1)), [f"Process {i}: [{i + 1}]" for i in range(n)]),
        ("reduce", lambda: reduce({"x": torch.ones(1, r + 1)}, "sum"), [f"Process {i}: {{'x': [1, {i + 1}]}}" for i in range(n)]),
        ("broadcast", lambda: broadcast([torch.ones(2 if r == 0 else 3)]), ["Process 0: [[2]]"] + [f"Process {i}: [[3]]" for i in range(1, n)]),
        ("gather", lambda: gather(torch.ones(1) if r else "text"), ["Process 0: <str>", "Process 1: [1]"]),
    ]
    for operation, call, expected in cases:
        try:
            call()
        except DistributedOperationException as error:
            message = str(error)
            assert f"Operation: `accelerate_ref.utils.operations.{operation}`" in message, message
            assert all(line in message for line in expected), message
        else:
            raise AssertionError(f"{operation} with mismatched shapes did not raise")
    assert gather(torch.tensor([r + 1])).tolist() == [i + 1 for i in range(n)]  # still in step after the errors


def _collective_checks():
    """Run on every rank: all collectives, then debug mode in a fresh state over the same group."""
    from accelerate_ref.state import PartialState

    state = PartialState()
    r, n = state.process_index, state.num_processes
    assert n == int(os.environ["WORLD_SIZE"]) and r == int(os.environ["RANK"])
    assert state.distributed_type == (DistributedType.MULTI_CPU if n > 1 else DistributedType.NO)
    for check in (_check_gather, _check_gather_object, _check_reduce, _check_broadcast, _check_pad):
        check(r, n)
    if n > 1:
        PartialState._reset_state()
        os.environ["ACCELERATE_DEBUG_MODE"] = "1"
        _check_debug_mode(r, n)
    state = PartialState()
    summary = {"rank": r, "num_processes": n, "local_rank": state.local_process_index}
    state.wait_for_everyone()
    state.destroy_process_group()  # as a torchrun script should; gloo may abort at exit otherwise
    return summary


@pytest.mark.slow
@pytest.mark.parametrize("world, machines", [(1, 1), (2, 1), (3, 1), (4, 1), (4, 2)], ids=["1", "2", "3", "4", "2x2"])
def test_collectives_multi_rank(world, machines):
    import simulators

    results = simulators.run(_collective_checks, world=world, machines=machines, timeout=180,
                             env={"ACCELERATE_DEBUG_MODE": "0"})
    per_machine = world // machines
    assert results == [
        {"rank": rank, "num_processes": world, "local_rank": rank % per_machine} for rank in range(world)
    ]


def test_tensor_dtype_codes_equal_hf() -> None:
    from accelerate.utils import operations as hf_ops

    from accelerate_ref.utils import operations as ref_ops

    assert ref_ops.TENSOR_TYPE_TO_INT == hf_ops.TENSOR_TYPE_TO_INT
    assert ref_ops.TENSOR_INT_TO_DTYPE == hf_ops.TENSOR_INT_TO_DTYPE


@pytest.mark.parametrize(("shape", "dtype"), [((3, 4), torch.bfloat16), ((5,), torch.int64), ((2, 1, 7), torch.bool),
                                             ((1,) * 50, torch.float)])
def test_gather_tensor_shape_encodes_as_hf_on_one_process(shape, dtype) -> None:
    """HF's own function reduces a `torch.empty` buffer (garbage on CPU), so it is compared by its encoding; the
    buffer has room for shapes of any number of dimensions torch allows (50 here)."""
    from accelerate.utils import operations as hf_ops

    from accelerate_ref import PartialState
    from accelerate_ref.utils import operations as ref_ops

    PartialState(cpu=True)
    ref_shape, ref_code = ref_ops.gather_tensor_shape(torch.ones(shape, dtype=dtype))
    assert hf_ops.TENSOR_INT_TO_DTYPE[ref_code] == dtype
    assert ref_shape.tolist() == [[d] for d in shape]


def test_verify_and_chained_operation_match_hf_on_one_process() -> None:
    from accelerate import PartialState as HfPartialState
    from accelerate.utils import operations as hf_ops

    from accelerate_ref import PartialState
    from accelerate_ref.utils import operations as ref_ops

    PartialState(cpu=True)
    HfPartialState(cpu=True)
    outcomes = []
    for ops in (ref_ops, hf_ops):
        def double(tensor):
            """Twice the tensor."""
            return tensor * 2

        def failing(tensor):
            raise ops.DistributedOperationException("inner")

        verified = ops.verify_operation(double)
        chained = ops.chained_operation(failing)
        with pytest.raises(ops.DistributedOperationException) as raised:
            chained(torch.ones(1))
        outcomes.append((
            verified(torch.arange(3)).tolist(), verified(tensor=torch.ones(2)).tolist(),
            verified.__name__, verified.__doc__, verified.__wrapped__ is double,
            str(raised.value).replace(ops.__name__, "<m>"), str(raised.value.__cause__),
        ))
    assert outcomes[0] == outcomes[1]
    assert "Error found while calling" in outcomes[0][5]


def test_nested_tensor_is_left_with_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that nested tensors are a prototype
        nested = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
    AcceleratorState._reset_state(True)
    Accelerator(cpu=True)
    with pytest.warns(CannotPadNestedTensorWarning):
        assert pad_across_processes(nested) is nested


def _ranks_copy_and_local_sgd() -> dict:
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    copied = copy_tensor_to_devices(torch.tensor([[1.5, 2.5]]) if rank == 1 else None)
    try:
        copy_tensor_to_devices(None)
        refused = ""
    except ValueError as error:
        refused = str(error)
    largest = reduce(torch.tensor([float(rank), 1.0 - rank]), "max")
    torch.manual_seed(rank)
    model = accelerator.prepare(torch.nn.Linear(2, 1))
    weights = []
    with LocalSGD(accelerator, model, local_sgd_steps=2) as sgd:
        for _ in range(2):
            with torch.no_grad():
                for param in model.parameters():
                    param.add_(float(rank + 1))
            sgd.step()
            weights.append(model.module.weight.detach().clone().tolist())
    return {"copied": copied.tolist(), "dtype": str(copied.dtype), "refused": refused, "weights": weights,
            "max": largest.tolist()}


def test_copy_tensor_to_devices_reduce_max_and_local_sgd_on_two_ranks() -> None:
    reports = simulators.run(_ranks_copy_and_local_sgd, world=2, timeout=120)
    for report in reports:
        assert report["copied"] == [[1.5, 2.5]] and report["dtype"] == "torch.float32"
        assert "exactly one process" in report["refused"] and "0 did" in report["refused"]
        assert report["max"] == [1.0, 1.0]
    # after step 1 the ranks differ (no averaging yet); after step 2 they agree (averaged)
    assert reports[0]["weights"][0] != reports[1]["weights"][0]
    assert reports[0]["weights"][1] == reports[1]["weights"][1]


@pytest.mark.usefixtures('fresh_accelerate_state')
def test_reduce_max_and_unknown_reduction() -> None:
    Accelerator(cpu=True)
    assert reduce(torch.tensor([1.0, 3.0]), "max").tolist() == [1.0, 3.0]
    assert reduce(torch.tensor([1.0]), "min").tolist() == [1.0]  # HF 1.15 checks no name


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
    assert pad_input_tensors(torch.ones(3, 2), 3, 4).shape == (4, 2), "dim 0 by default"
    with pytest.raises(ValueError, match="empty tensor"):
        pad_input_tensors(torch.ones(0, 2), 1, 2)  # no last entry to repeat
    assert pad_input_tensors(torch.arange(8), 8, 4).tolist() == list(range(8))
    padded = pad_input_tensors({"x": torch.arange(6).view(2, 3)}, 3, 2, dim=1)
    assert padded["x"].tolist() == [[0, 1, 2, 2], [3, 4, 5, 5]]
    with pytest.raises(TypeError, match="str"):
        pad_input_tensors(["a"], 1, 2)


def test_is_torch_xpu_tensor_is_false_off_an_xpu() -> None:
    """The reference's rule (HF 1.15's raises for every input: DIFFERENTIAL.toml): True only for a tensor on an XPU."""
    from accelerate_ref.utils.operations import is_torch_xpu_tensor

    assert [is_torch_xpu_tensor(value) for value in (torch.ones(1), torch.ones(1, device="meta"), [1.0], "xpu")] == [
        False, False, False, False]
