"""Catalog: gather.*, gather_object.*, reduce.*, pad.*, broadcast.from_process,
broadcast_object_list.in_place, debug.shape_mismatch.

Single-process tests run here; multi-rank ones run `_collective_checks` on every
rank of simulated worlds (1, 2, 3, 4, 2 machines x 2) through `simulators.run`.
Assertions run inside the ranks: a failed one fails the launch with the rank's
traceback.
"""

import os
from collections import namedtuple

import pytest
import torch

from accelerate_ref.utils import (
    DistributedOperationException,
    DistributedType,
    broadcast,
    broadcast_object_list,
    gather,
    gather_object,
    pad_across_processes,
    reduce,
)

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
