"""A no-compute op's results from its arguments' metadata (:mod:`simulators.devices.no_compute.meta_results`): a kept call's
results equal torch's Meta kernel's (sizes, strides, dtype, storage bytes); what makes two calls differ (a scalar's
type, the default dtype, a CPU scalar's value) makes them two calls; views, in-place ops, calls that raise and
calls with CPU data are run each time. In-process: the module sees meta payloads only, as a rank's dispatch gives it.
"""
from __future__ import annotations

import pytest
import torch

from simulators.devices.no_compute import meta_results

aten = torch.ops.aten


class Counted:
    """An op that counts the calls that reach its Meta kernel (the module asks an op for its schema and tags)."""

    def __init__(self, op: torch._ops.OpOverload) -> None:
        self.op, self.calls, self._schema, self.tags, self.name = op, 0, op._schema, op.tags, op.name
        self.lengths: list[int] = []  # a foreach op's: the length of its first list, per call

    def __call__(self, *args, **kwargs):
        self.calls += 1
        self.lengths += [len(args[0])] if isinstance(args[0], list) else []
        return self.op(*args, **kwargs)


@pytest.fixture(autouse=True)
def no_kept_calls(monkeypatch):
    monkeypatch.setattr(meta_results, "_results", {})


def meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def described(value):
    if isinstance(value, torch.Tensor):
        return value.device.type, tuple(value.shape), value.stride(), value.dtype, value.untyped_storage().nbytes()
    if isinstance(value, (tuple, list)):
        return type(value).__name__, [described(item) for item in value]
    return value


CALLS = {
    "add, broadcast": (aten.add.Tensor, (meta(4, 1, 8), meta(3, 1)), {}),
    "sum over a dim, kept": (aten.sum.dim_IntList, (meta(4, 6, 8), [1]), {"keepdim": True}),
    "mm of a transposed input's layout": (aten.mm.default, (meta(8, 4), torch.empty_strided((4, 16), (1, 4), device="meta")), {}),
    "softmax backward": (aten._softmax_backward_data.default, (meta(2, 8), meta(2, 8), -1, torch.float32), {}),
    "to another dtype": (aten._to_copy.default, (meta(4, 4),), {"dtype": torch.bfloat16}),
    "a channels-last conv input's clone": (aten.clone.default, (torch.empty(2, 3, 4, 5, device="meta").contiguous(
        memory_format=torch.channels_last),), {"memory_format": torch.preserve_format}),
    "max with indices": (aten.max.dim, (meta(4, 6), 1), {}),
    "an empty result": (aten.mul.Tensor, (meta(0, 6), meta(6)), {}),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_a_kept_call_is_answered_with_the_results_of_torchs_meta_kernel(name):
    op, args, kwargs = CALLS[name]
    counted = Counted(op)
    first, second = meta_results.run(counted, args, kwargs), meta_results.run(counted, args, kwargs)
    assert counted.calls == 1, f"{name}: the second call with the same metadata ran the Meta kernel again"
    expected = described(op(*args, **kwargs))
    assert described(first) == described(second) == expected, (
        f"{name}: torch's Meta kernel gives {expected}, the kept call's answer {described(second)}")
    assert type(second) is type(op(*args, **kwargs)), f"{name}: the result's type differs from torch's"


@pytest.mark.parametrize("scalars", [(1, 1.0), (1, True), (2, 2.0)], ids=["int-float", "int-bool", "two-float"])
def test_a_scalars_type_makes_another_call(scalars):
    """``int_tensor * 1`` is integral and ``int_tensor * 1.0`` is not, though ``1 == 1.0`` as dict keys."""
    integers = meta(3, dtype=torch.int32)
    for scalar in (*scalars, *reversed(scalars)):
        got = meta_results.run(aten.mul.Tensor, (integers, scalar), {}).dtype
        assert got == aten.mul.Tensor(integers, scalar).dtype, f"int32 tensor * {scalar!r}: got {got}"


def test_the_default_dtype_makes_another_call():
    args, kwargs = ([3],), {"device": torch.device("meta")}
    previous = torch.get_default_dtype()
    try:
        for default in (torch.float32, torch.float64, torch.float32):
            torch.set_default_dtype(default)
            got = meta_results.run(aten.empty.memory_format, args, kwargs).dtype
            assert got == default, f"torch.empty(3) with the default dtype {default}: got {got}"
    finally:
        torch.set_default_dtype(previous)


def test_a_cpu_scalars_value_makes_another_call():
    for value in (2, 3, 2):
        scalar = torch.tensor(value)
        got = meta_results.run(aten.repeat_interleave.self_Tensor, (meta(4), scalar), {}).shape
        assert got == aten.repeat_interleave.self_Tensor(meta(4), scalar).shape, f"repeats {value}: got {got}"


def test_a_cpu_tensor_with_data_is_run_each_time():
    """A Meta kernel may read a CPU tensor's values (its sizes may come from them)."""
    counted = Counted(_test_op("rows(Tensor x, Tensor sizes) -> Tensor", lambda x, sizes: x.new_empty(int(sizes.sum()))))
    for sizes in ([1, 2], [3, 4]):
        result = meta_results.run(counted, (meta(3), torch.tensor(sizes)), {})
        assert result.shape == (sum(sizes),), f"CPU sizes {sizes}: got {tuple(result.shape)}"
    assert counted.calls == 2, "a call with a CPU tensor of data was answered from an earlier one"


@pytest.mark.parametrize("op, args", [(aten.view.default, (meta(4, 6), [24])), (aten.add_.Tensor, (meta(4), meta(4))),
                                      (aten.t.default, (meta(4, 6),))], ids=["view", "in-place", "transpose"])
def test_views_and_in_place_ops_are_run_each_time(op, args):
    counted = Counted(op)
    results = [meta_results.run(counted, args, {}) for _ in range(2)]
    assert counted.calls == 2, f"{op} was answered from an earlier call"
    assert all(result.untyped_storage()._cdata == args[0].untyped_storage()._cdata for result in results), (
        f"{op}: its result must share its input's storage")


def test_a_call_that_raised_raises_again():
    counted = Counted(aten.add.Tensor)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="broadcast"):
            meta_results.run(counted, (meta(3), meta(4)), {})
    assert counted.calls == 2


def test_a_result_larger_than_its_sizes_is_run_each_time():
    """A result whose storage holds more than its sizes need (here: an op's view of a larger new tensor) would be
    remade smaller: the memory books would count other bytes."""
    counted = Counted(_test_op("larger(Tensor x) -> Tensor", lambda x: torch.empty(64, device="meta")[:4]))
    results = [meta_results.run(counted, (meta(4),), {}) for _ in range(2)]
    assert counted.calls == 2 and all(result.untyped_storage().nbytes() == 256 for result in results)


#: A Llama's layers over again: three shapes, repeated.
LAYERS = [(8, 4), (4, 8), (8,)] * 4


def test_a_foreach_op_runs_once_per_distinct_element_with_each_elements_results():
    tensors, others = [meta(*shape) for shape in LAYERS], [meta(*shape) for shape in LAYERS]
    others[4] = meta(1)  # broadcast: another element
    for op, args in [(aten._foreach_sqrt.default, (tensors,)), (aten._foreach_add.List, (tensors, others)),
                     (aten._foreach_mul.ScalarList, ([meta(4, dtype=torch.int32)] * 4, [2, 2.0, 2, True]))]:
        counted = Counted(op)
        got, expected = meta_results.run(counted, args, {}), op(*args)
        assert counted.lengths == [len({meta_results._describe(entries) for entries in zip(*(a for a in args if isinstance(a, list)))})], (
            f"{op}: its Meta kernel ran on lists of {counted.lengths} elements, not once on the distinct ones")
        assert described(got) == described(expected), f"{op}: torch gives {described(expected)}, the simulator {described(got)}"
        storages = {result.untyped_storage()._cdata for result in got}
        assert len(storages) == len(got), f"{op}: results share storage (each element's result is a tensor of its own)"


def test_an_in_place_foreach_op_checks_each_distinct_element():
    tensors = [meta(*shape) for shape in LAYERS]
    counted = Counted(aten._foreach_add_.List)
    assert meta_results.run(counted, (tensors, [meta(*shape) for shape in LAYERS]), {}) is None
    assert counted.lengths == [3]
    with pytest.raises(RuntimeError):  # an element that does not broadcast into its tensor, among equal ones
        meta_results.run(aten._foreach_add_.List, (tensors, [*[meta(*shape) for shape in LAYERS[:-1]], meta(3)]), {})


_LIBRARY = torch.library.Library("meta_results_test", "DEF")


def _test_op(schema: str, meta_kernel) -> torch._ops.OpOverload:
    """An op of this test's library with ``meta_kernel`` as its Meta kernel."""
    name = schema.split("(")[0]
    _LIBRARY.define(schema)
    _LIBRARY.impl(name, meta_kernel, "Meta")
    return getattr(torch.ops.meta_results_test, name).default
