"""Catalog section "Collectives".

Every rank builds its input from the launcher's rank (``world.rank``), not
from what the implementation reports, and compares the result with what the
rule gives for the whole world. Values differ from rank to rank (and within a
rank where order matters), so a collective that drops, reorders, duplicates
or sums where it should concatenate shows up. The four
``gather_for_metrics.*`` rows need prepared data loaders and live elsewhere.
"""

from __future__ import annotations

import torch

from ..engine.case import ANY_WORLD, case
from ..support.checks import expect_equal, expect_raises, expect_tensor, expect_true, layout, plain, shapes_mentioned

DISTRIBUTED_WORLDS = tuple(w for w in ANY_WORLD if w != "1")


# -- gather ------------------------------------------------------------------


@case("gather.doc_example", worlds=[4])
def gather_doc_example(impl, world):
    """``gather(torch.tensor([process_index]))`` gives ``tensor([0, 1, 2, 3])`` on every rank."""
    acc = impl.Accelerator()
    got = acc.gather(torch.tensor([acc.process_index]).to(acc.device))
    expect_tensor(got, [0, 1, 2, 3], "accelerator.gather(tensor([process_index])) at 4 processes")
    return plain(got)


@gather_doc_example.check
def _gather_doc_example_same_everywhere(values, world):
    for rank, value in enumerate(values):
        expect_equal(value, [0, 1, 2, 3], f"rank {rank}: gathered tensor")


def _rank_block(rank: int) -> torch.Tensor:
    """A [2, 3] block whose every entry names its rank and position (rank r: 100r + 0..5)."""
    return torch.arange(6).reshape(2, 3) + 100 * rank


@case("gather.first_dim")
def gather_first_dim(impl, world):
    """The first dimension is ``num_processes`` times the input's; blocks are concatenated in rank order.

    Both `Accelerator.gather` and the utility `gather` are checked, on a
    [2, 3] integer block and on a 1-d float tensor of 3.
    """
    acc = impl.Accelerator()
    block = _rank_block(world.rank).to(acc.device)
    expected = torch.cat([_rank_block(r) for r in range(world.size)])
    got = acc.gather(block)
    expect_tensor(got, expected, f"accelerator.gather of each rank's [2, 3] block at world {world.label}")
    row = torch.tensor([world.rank + 0.25, world.rank + 0.5, world.rank + 0.75], device=acc.device)
    expected_rows = torch.tensor([[r + 0.25, r + 0.5, r + 0.75] for r in range(world.size)]).reshape(-1)
    got_rows = impl.utils.gather(row)
    expect_tensor(got_rows, expected_rows, "utils.gather of each rank's 1-d float tensor of 3")
    expect_equal(block.tolist(), _rank_block(world.rank).tolist(), "gather must leave its input unchanged")


@case("gather.nested")
def gather_nested(impl, world):
    """A nested dict/list/tuple of tensors is gathered leaf by leaf; containers keep their types."""
    acc = impl.Accelerator()
    r, n = world.rank, world.size
    data = {
        "a": torch.tensor([r]),
        "b": [torch.tensor([[r, 10 + r]]), (torch.tensor([20.0 + r]), torch.tensor([30 + r, 40 + r]))],
    }
    got = acc.gather(impl.utils.send_to_device(data, acc.device))
    expected = {
        "a": torch.tensor(list(range(n))),
        "b": [
            torch.tensor([[q, 10 + q] for q in range(n)]),
            (torch.tensor([20.0 + q for q in range(n)]), torch.tensor([v for q in range(n) for v in (30 + q, 40 + q)])),
        ],
    }
    expect_equal(layout(got), layout(expected), "layout of the gathered structure (container types, tensor dtypes and shapes)")
    expect_equal(got, expected, "values of the gathered structure")


@case("gather.scalar")
def gather_scalar(impl, world):
    """A 0-d tensor gathers to a 1-d tensor of length ``num_processes`` (length 1 on one process)."""
    acc = impl.Accelerator()
    got = acc.gather(torch.tensor(float(world.rank) + 0.5, device=acc.device))
    expect_tensor(got, [r + 0.5 for r in range(world.size)], "gather of each rank's 0-d tensor (rank + 0.5)")


# -- gather_object -------------------------------------------------------------


@case("gather_object.nested")
def gather_object_nested(impl, world):
    """``gather_object(list)`` concatenates every rank's list in rank order, for any picklable items.

    ``[r]`` gives ``[0, 1, ...]``; ``[[r, r]]`` gives ``[[0, 0], [1, 1], ...]``;
    rank r contributing r + 1 items checks concatenation (not one entry per rank).
    """
    impl.Accelerator()
    r, n = world.rank, world.size
    gather_object = impl.utils.gather_object
    expect_equal(gather_object([r]), list(range(n)), "gather_object([rank])")
    expect_equal(gather_object([[r, r]]), [[q, q] for q in range(n)], "gather_object([[rank, rank]])")
    items = [("item", r, i, {"set": {r}}) for i in range(r + 1)]
    expected = [("item", q, i, {"set": {q}}) for q in range(n) for i in range(q + 1)]
    expect_equal(gather_object(items), expected, "gather_object of r + 1 tuples of mixed picklables on rank r")


@case("gather_object.structures")
def gather_object_structures(impl, world):
    """A dict on each rank (nested dicts included) gives the list of every rank's dict, in rank order.

    HF accelerate 1.15 returns the dicts' keys instead (accelerate issue #2188):
    a manifest deviation, not the rule.
    """
    impl.Accelerator()
    r, n = world.rank, world.size
    got = impl.utils.gather_object({"k": r, "nested": {"rank": [r, r * 10]}})
    expected = [{"k": q, "nested": {"rank": [q, q * 10]}} for q in range(n)]
    expect_equal(got, expected, "gather_object of a nested dict per rank")


# -- reduce ------------------------------------------------------------------


@case("reduce.doc_example", worlds=[2])
def reduce_doc_example(impl, world):
    """``reduce(arange(num_processes) + 1 + 2 * process_index, "sum")`` gives ``tensor([4, 6])`` at 2 processes."""
    acc = impl.Accelerator()
    process_tensor = torch.arange(acc.num_processes) + 1 + (2 * acc.process_index)
    got = acc.reduce(process_tensor.to(acc.device), reduction="sum")
    expect_tensor(got, [4, 6], "accelerator.reduce(..., reduction='sum') at 2 processes")


@case("reduce.doc_example", worlds=[w for w in ANY_WORLD if w != "2"])
def reduce_sum_any_world(impl, world):
    """The documented example at other worlds: element i sums ``i + 1 + 2r`` over ranks r."""
    acc = impl.Accelerator()
    n = world.size
    process_tensor = torch.arange(n) + 1 + 2 * world.rank
    got = acc.reduce(process_tensor.to(acc.device), reduction="sum")
    expected = [sum(i + 1 + 2 * r for r in range(n)) for i in range(n)]
    expect_tensor(got, expected, f"accelerator.reduce(..., reduction='sum') at world {world.label}")


def _mean_input(rank: int) -> torch.Tensor:
    return torch.tensor([rank + 1.0, 10.0 * (rank + 1), -2.0 * rank])


@case("reduce.mean")
def reduce_mean(impl, world):
    """``reduction="mean"`` divides the sum by ``num_processes``; the utility defaults to "mean", the Accelerator to "sum"."""
    acc = impl.Accelerator()
    n = world.size
    tensor = _mean_input(world.rank).to(acc.device)
    total = sum(_mean_input(r) for r in range(n))
    mean = total / n
    expect_tensor(impl.utils.reduce(tensor, reduction="mean"), mean, "utils.reduce(t, reduction='mean')")
    expect_tensor(impl.utils.reduce(tensor), mean, "utils.reduce(t) (default reduction is 'mean')")
    expect_tensor(acc.reduce(tensor, reduction="mean"), mean, "accelerator.reduce(t, reduction='mean')")
    expect_tensor(acc.reduce(tensor), total, "accelerator.reduce(t) (default reduction is 'sum')")
    expect_tensor(impl.utils.reduce(tensor, reduction="sum"), total, "utils.reduce(t, reduction='sum')")
    expect_tensor(tensor, _mean_input(world.rank), "reduce must leave its input unchanged")


@case("reduce.none")
def reduce_none(impl, world):
    """``reduction="none"`` returns the input's values unchanged (no reduction across ranks).

    HF accelerate 1.15 sums instead: a known upstream deviation for its manifest.
    """
    acc = impl.Accelerator()
    mine = [world.rank + 1.0, 7.0 * world.rank]
    tensor = torch.tensor(mine, device=acc.device)
    expect_tensor(acc.reduce(tensor, reduction="none"), mine, "accelerator.reduce(t, reduction='none')")
    expect_tensor(impl.utils.reduce(tensor, reduction="none"), mine, "utils.reduce(t, reduction='none')")
    expect_tensor(tensor, mine, "reduce(t, 'none') must leave its input unchanged")


@case("reduce.nested")
def reduce_nested(impl, world):
    """Nested dict/list/tuple structures are reduced leaf by leaf, containers kept."""
    acc = impl.Accelerator()
    r, n = world.rank, world.size

    def data(q: int) -> dict:
        return {"a": torch.tensor([q + 1.0]), "b": [torch.tensor([[1.0, 2.0 * q]]), (torch.tensor(3.0 * q + 1),)]}

    sums = {
        "a": torch.tensor([sum(q + 1.0 for q in range(n))]),
        "b": [torch.tensor([[float(n), sum(2.0 * q for q in range(n))]]), (torch.tensor(sum(3.0 * q + 1 for q in range(n))),)],
    }
    got = acc.reduce(impl.utils.send_to_device(data(r), acc.device), reduction="sum")
    expect_equal(layout(got), layout(sums), "layout of accelerator.reduce(structure, 'sum')")
    expect_equal(got, sums, "values of accelerator.reduce(structure, 'sum')")
    got_mean = impl.utils.reduce(impl.utils.send_to_device(data(r), acc.device), reduction="mean")
    means = {"a": sums["a"] / n, "b": [sums["b"][0] / n, (sums["b"][1][0] / n,)]}
    expect_equal(layout(got_mean), layout(means), "layout of utils.reduce(structure, 'mean')")
    expect_equal(got_mean, means, "values of utils.reduce(structure, 'mean')")


# -- pad_across_processes --------------------------------------------------------


@case("pad.doc_example", worlds=[2])
def pad_doc_example(impl, world):
    """Rank r holds ``arange(r + 1)``; ``pad_across_processes`` gives shape [2] on every rank (zeros appended)."""
    acc = impl.Accelerator()
    process_tensor = torch.arange(acc.process_index + 1).to(acc.device)
    padded = acc.pad_across_processes(process_tensor)
    expect_equal(list(padded.shape), [2], "padded_tensor.shape")
    expect_tensor(padded, [[0, 0], [0, 1]][world.rank], "padded values (pad_index 0 at the end)")


def _pad_rows(rank: int, n: int, width: int, pad_index: int, pad_first: bool) -> list[list[int]]:
    """Expected rows of a [2, width] tensor of rank-specific values padded to n on dim 1."""
    rows = [[100 * rank + 10 * row + j + 1 for j in range(width)] for row in range(2)]
    fill = [pad_index] * (n - width)
    return [fill + row if pad_first else row + fill for row in rows]


@case("pad.pad_first_index_dim")
def pad_first_index_dim(impl, world):
    """``dim``, ``pad_index`` and ``pad_first`` are honoured; nested structures are padded leaf by leaf.

    Rank r holds ``x`` of shape [2, r + 1] and ``y`` of shape [2, n - r] (so
    a different rank holds the largest of each), all values non-zero. Padded
    on ``dim=1`` (and ``dim=-1``) to n with ``pad_index=-7``, at the end and,
    with ``pad_first=True``, at the start; a [n - r, 2] leaf padded on dim 0
    with the defaults gets zero rows at the end.
    """
    acc = impl.Accelerator()
    r, n = world.rank, world.size

    def block(q: int, width: int) -> torch.Tensor:
        return torch.tensor(_pad_rows(q, width, width, 0, False))

    for dim in (1, -1):
        for pad_first in (False, True):
            data = {"x": block(r, r + 1), "nest": [(block(r, n - r),)]}
            got = acc.pad_across_processes(
                impl.utils.send_to_device(data, acc.device), dim=dim, pad_index=-7, pad_first=pad_first
            )
            expected = {
                "x": torch.tensor(_pad_rows(r, n, r + 1, -7, pad_first)),
                "nest": [(torch.tensor(_pad_rows(r, n, n - r, -7, pad_first)),)],
            }
            what = f"pad_across_processes(structure, dim={dim}, pad_index=-7, pad_first={pad_first})"
            expect_equal(layout(got), layout(expected), f"layout of {what}")
            expect_equal(got, expected, f"values of {what}")
    column = torch.tensor([[r + 1, -(r + 1)]] * (n - r), device=acc.device)
    got = impl.utils.pad_across_processes(column)
    expected = [[r + 1, -(r + 1)]] * (n - r) + [[0, 0]] * r
    expect_tensor(got, expected, "utils.pad_across_processes(t) of a [n - r, 2] tensor (dim 0, zeros at the end)")


# -- broadcast -----------------------------------------------------------------


def _broadcast_payload(rank: int) -> dict:
    return {"t": torch.tensor([[rank, 10 * rank], [100 * rank + 1, 7]]), "l": [torch.tensor([rank + 0.5])]}


@case("broadcast.from_process")
def broadcast_from_process(impl, world):
    """``broadcast(tensor, from_process=k)`` gives rank k's tensors everywhere, for every k (default 0)."""
    acc = impl.Accelerator()
    got = impl.utils.broadcast(impl.utils.send_to_device(_broadcast_payload(world.rank), acc.device))
    expect_equal(got, _broadcast_payload(0), "broadcast(structure) (from_process defaults to 0)")
    for source in range(world.size):
        got = impl.utils.broadcast(
            impl.utils.send_to_device(_broadcast_payload(world.rank), acc.device), from_process=source
        )
        expect_equal(layout(got), layout(_broadcast_payload(source)), f"layout of broadcast(structure, from_process={source})")
        expect_equal(got, _broadcast_payload(source), f"broadcast(structure, from_process={source})")


@case("broadcast_object_list.in_place")
def broadcast_object_list_in_place(impl, world):
    """The list is modified in place with rank ``from_process``'s objects (and returned)."""
    impl.Accelerator()

    def objects(rank: int) -> list:
        return [f"rank {rank}", {"rank": rank, "items": list(range(rank))}, rank * 1.5, None if rank else ("zero",)]

    for source in [0] + list(range(world.size)):
        mine = objects(world.rank)
        returned = impl.utils.broadcast_object_list(mine, from_process=source)
        expect_equal(mine, objects(source), f"the list passed to broadcast_object_list(from_process={source}) afterwards")
        expect_true(
            returned is mine,
            f"broadcast_object_list should return the list it modified in place; it returned {type(returned).__name__} {returned!r}",
        )


# -- local operations ------------------------------------------------------------


@case("ops.concatenate", worlds=[1])
def ops_concatenate(impl, world):
    """``concatenate`` joins a list of same-structured nested tensors on ``dim``, leaf by leaf."""
    concatenate = impl.utils.concatenate
    batches = [
        {"a": torch.tensor([[1, 2]]), "b": (torch.tensor([1.0]), [torch.tensor([[5]])])},
        {"a": torch.tensor([[3, 4]]), "b": (torch.tensor([2.0]), [torch.tensor([[6]])])},
        {"a": torch.tensor([[5, 6], [7, 8]]), "b": (torch.tensor([3.0, 4.0]), [torch.tensor([[7], [8]])])},
    ]
    expected = {
        "a": torch.tensor([[1, 2], [3, 4], [5, 6], [7, 8]]),
        "b": (torch.tensor([1.0, 2.0, 3.0, 4.0]), [torch.tensor([[5], [6], [7], [8]])]),
    }
    got = concatenate(batches)
    expect_equal(layout(got), layout(expected), "layout of concatenate(list of nested batches)")
    expect_equal(got, expected, "concatenate(list of nested batches) on dim 0")
    expect_tensor(
        concatenate([torch.tensor([[1], [2]]), torch.tensor([[3], [4]])], dim=1),
        [[1, 3], [2, 4]],
        "concatenate([[[1], [2]], [[3], [4]]], dim=1)",
    )


@case("ops.send_to_device", worlds=[1])
def ops_send_to_device(impl, world):
    """Nested tensors move to the device; values under ``skip_keys`` stay; non-tensor leaves are untouched.

    The target is torch's ``meta`` device, so a tensor that moved is
    distinguishable from one that stayed on the CPU on any machine.
    """
    send_to_device = impl.utils.send_to_device
    label = object()
    data = {"a": torch.ones(2), "b": [torch.zeros(1), ("text", 3, label)], "labels": torch.ones(1)}
    got = send_to_device(data, "meta", skip_keys=["labels"])
    expect_equal(layout(got), layout(data), "layout after send_to_device")
    expect_equal(got["a"].device.type, "meta", "device of data['a']")
    expect_equal(got["b"][0].device.type, "meta", "device of data['b'][0]")
    expect_equal(got["labels"].device.type, "cpu", "device of data['labels'] (in skip_keys)")
    expect_true(got["b"][1][0] == "text" and got["b"][1][1] == 3 and got["b"][1][2] is label, "non-tensor leaves must come back untouched")
    got = send_to_device(data, "meta", skip_keys="labels")
    expect_equal(got["labels"].device.type, "cpu", "device of data['labels'] with skip_keys='labels' (a string)")
    expect_equal(got["a"].device.type, "meta", "device of data['a'] with skip_keys='labels'")
    expect_equal(data["a"].device.type, "cpu", "the input's own tensors stay where they were")
    expect_equal(send_to_device(torch.ones(1), "meta").device.type, "meta", "send_to_device(tensor, 'meta')")


@case("ops.slice_tensors", worlds=[1])
def ops_slice_tensors(impl, world):
    """``slice_tensors`` applies one slice to every tensor of a nested structure; other leaves are kept."""
    data = {"a": torch.arange(6).reshape(3, 2), "b": [torch.arange(4), (torch.arange(10, 15),)], "c": "label"}
    got = impl.utils.slice_tensors(data, slice(1, 3))
    expected = {"a": torch.tensor([[2, 3], [4, 5]]), "b": [torch.tensor([1, 2]), (torch.tensor([11, 12]),)], "c": "label"}
    expect_equal(layout(got), layout(expected), "layout of slice_tensors(structure, slice(1, 3))")
    expect_equal(got, expected, "slice_tensors(structure, slice(1, 3))")


@case("ops.recursively_apply", worlds=[1])
def ops_recursively_apply(impl, world):
    """A function is applied to the leaves ``test_type`` accepts (tensors by default), passing extra args and kwargs;
    other leaves are kept, or with ``error_on_other_type=True`` raise a TypeError."""
    from collections import namedtuple

    recursively_apply = impl.utils.recursively_apply
    Pair = namedtuple("Pair", "first second")

    def affine(tensor, factor, offset=0):
        return tensor * factor + offset

    data = {"p": Pair(torch.tensor([1, 2]), "keep"), "l": [torch.tensor(3), (torch.tensor([4]), 5.5)]}
    got = recursively_apply(affine, data, 3, offset=10)
    expect_true(type(got["p"]) is Pair, f"namedtuples keep their type: got {type(got['p']).__name__}")
    expect_equal(got["p"].first, [13, 16], "func(leaf, *args, **kwargs) on a namedtuple field")
    expect_equal(got["p"].second, "keep", "a non-tensor leaf is kept")
    expect_equal(got["l"], [19, ([22], 5.5)], "func applied in a nested list/tuple, non-tensors kept")
    error = expect_raises(
        lambda: recursively_apply(affine, data, 3, error_on_other_type=True),
        TypeError,
        "recursively_apply(..., error_on_other_type=True) on a structure with str and float leaves",
    )
    expect_true("str" in str(error) or "float" in str(error), f"the TypeError should name the offending type: {error}")
    ints = recursively_apply(lambda value: value + 1, [1, "x", 2.5, [4]], test_type=lambda value: isinstance(value, int))
    expect_equal(ints, [2, "x", 2.5, [5]], "recursively_apply with test_type accepting ints")


@case("ops.listify", worlds=[1])
def ops_listify(impl, world):
    """Tensors anywhere in a nested structure become Python lists/numbers (bf16 included)."""
    data = {
        "a": torch.tensor([[1, 2], [3, 4]]),
        "b": (torch.tensor(3.5), [torch.tensor([True]), torch.tensor([1.5, -2.0], dtype=torch.bfloat16)]),
        "s": "keep",
    }
    got = impl.utils.listify(data)
    expected = {"a": [[1, 2], [3, 4]], "b": (3.5, [[True], [1.5, -2.0]]), "s": "keep"}
    expect_true(repr(got) == repr(expected), f"listify(structure): expected {expected!r}, got {got!r}")


@case("ops.convert_to_fp32", worlds=[1])
def ops_convert_to_fp32(impl, world):
    """fp16/bf16 leaves become fp32 with their values; other leaves are untouched;
    ``convert_outputs_to_fp32`` wraps a forward so its half-precision outputs come back in fp32."""
    fp64 = torch.tensor([0.1], dtype=torch.float64)
    data = {
        "h": torch.tensor([1.5], dtype=torch.float16),
        "b": [torch.tensor([2.5, -1.0], dtype=torch.bfloat16)],
        "f": torch.tensor([0.25]),
        "d": fp64,
        "i": torch.tensor([7]),
        "s": "text",
    }
    got = impl.utils.convert_to_fp32(data)
    expected = {"h": torch.tensor([1.5]), "b": [torch.tensor([2.5, -1.0])], "f": torch.tensor([0.25]), "d": fp64, "i": torch.tensor([7]), "s": "text"}
    expect_equal(layout(got), layout(expected), "layout (dtypes) after convert_to_fp32")
    expect_equal(got, expected, "values after convert_to_fp32")

    def forward(x):
        return {"out": (x * 2).half(), "aux": (x.bfloat16(), 3)}

    wrapped = impl.utils.convert_outputs_to_fp32(forward)
    out = wrapped(torch.tensor([1.25]))
    expect_equal(layout(out), {"out": "tensor[float32][1]", "aux": ("tensor[float32][1]", "<int>")}, "layout of a wrapped forward's outputs")
    expect_equal(out, {"out": [2.5], "aux": ([1.25], 3)}, "values of a wrapped forward's outputs")


# -- debug mode ------------------------------------------------------------------

DEBUG_ENV = {"ACCELERATE_DEBUG_MODE": "1"}
DEBUG_WORLDS = [2]


def _mismatch_raised(impl, world, operation: str, shape_of, call, control) -> str:
    """Run ``control`` (equal shapes: must still work in debug mode), then ``call`` on this rank's
    mismatched input; the call must raise, naming every rank's shape."""
    control()
    mine = torch.ones(*shape_of(world.rank))
    error = expect_raises(
        lambda: call(mine),
        Exception,
        f"{operation} of a {list(mine.shape)} tensor on rank {world.rank} (shapes differ across ranks) with ACCELERATE_DEBUG_MODE=1",
    )
    message = f"{type(error).__name__}: {error}"
    chained = error.__cause__ or error.__context__
    if chained is not None:
        message += f"\n(caused by {type(chained).__name__}: {chained})"
    found = shapes_mentioned(message)
    missing = [(rank, list(shape_of(rank))) for rank in range(world.size) if tuple(shape_of(rank)) not in found]
    expect_equal(missing, [], f"ranks whose shape the {operation} error does not name (message: {message!r})")
    return message


@case("debug.shape_mismatch", worlds=DEBUG_WORLDS, env=DEBUG_ENV)
def debug_shape_mismatch_gather(impl, world):
    """With ``ACCELERATE_DEBUG_MODE=1``, a ``gather`` whose shapes differ across ranks raises on every rank,
    naming each rank's shape, instead of hanging or returning garbage; equal shapes still gather."""
    acc = impl.Accelerator()

    def control():
        got = acc.gather(torch.tensor([world.rank, -world.rank], device=acc.device))
        expect_tensor(got, [v for r in range(world.size) for v in (r, -r)], "gather of equal shapes in debug mode")

    return _mismatch_raised(impl, world, "gather", lambda r: (r + 2, 3), lambda t: acc.gather(t.to(acc.device)), control)


@case("debug.shape_mismatch", worlds=DEBUG_WORLDS, env=DEBUG_ENV)
def debug_shape_mismatch_reduce(impl, world):
    """With ``ACCELERATE_DEBUG_MODE=1``, a ``reduce`` whose shapes differ across ranks raises on every rank,
    naming each rank's shape; equal shapes still reduce."""
    acc = impl.Accelerator()

    def control():
        got = acc.reduce(torch.tensor([world.rank + 1.0], device=acc.device), reduction="sum")
        expect_tensor(got, [sum(r + 1.0 for r in range(world.size))], "reduce of equal shapes in debug mode")

    return _mismatch_raised(
        impl, world, "reduce", lambda r: (3, r + 4), lambda t: acc.reduce(t.to(acc.device), reduction="sum"), control
    )


@case("debug.shape_mismatch", worlds=DEBUG_WORLDS, env=DEBUG_ENV)
def debug_shape_mismatch_broadcast(impl, world):
    """With ``ACCELERATE_DEBUG_MODE=1``, a ``broadcast`` whose shapes differ across ranks raises on every rank,
    naming each rank's shape; equal shapes still broadcast."""
    acc = impl.Accelerator()
    broadcast = impl.utils.broadcast

    def control():
        got = broadcast(torch.tensor([world.rank + 5], device=acc.device), from_process=world.size - 1)
        expect_tensor(got, [world.size + 4], "broadcast of equal shapes in debug mode")

    return _mismatch_raised(
        impl, world, "broadcast", lambda r: (r + 6,), lambda t: broadcast(t.to(acc.device)), control
    )
