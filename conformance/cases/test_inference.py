"""Catalog section "Inference helpers": ``split_between_processes``.

Each rank returns the share it was given; the driver puts the shares side by
side and checks them against the rule for the whole world (contiguous
shares in rank order, earlier ranks taking the extras, padding with the last
input), so a split that overlaps, skips or reorders items is seen as such.
"""

from __future__ import annotations

import torch

from ..engine.case import ANY_WORLD, case
from ..support.checks import expect_equal, expect_raises, expect_true, layout, plain

DISTRIBUTED_WORLDS = tuple(w for w in ANY_WORLD if w != "1")


def _bounds(count: int, size: int) -> list[tuple[int, int]]:
    """The documented shares: contiguous, sizes differing by at most one, extras to the first ranks."""
    per, extras = divmod(count, size)
    bounds, start = [], 0
    for rank in range(size):
        end = start + per + (1 if rank < extras else 0)
        bounds.append((start, end))
        start = end
    return bounds


def _padded(items: list, count: int, size: int) -> list[list]:
    """Each rank's share padded with the input's last item to the longest share's length."""
    longest = -(-count // size)
    return [items[a:b] + [items[-1]] * (longest - (b - a)) for a, b in _bounds(count, size)]


def _split(acc, inputs, apply_padding=False):
    with acc.split_between_processes(inputs, apply_padding=apply_padding) as share:
        return share


@case("split.doc_example", worlds=[2])
def split_doc_example(impl, world):
    """``split_between_processes(["A", "B", "C"])``: rank 0 gets ``["A", "B"]``, rank 1 ``["C"]``."""
    acc = impl.Accelerator()
    share = _split(acc, ["A", "B", "C"])
    expect_true(isinstance(share, list), f"a list input gives a list share, got {type(share).__name__}")
    return share


@split_doc_example.check
def _doc_shares(values, world):
    expect_equal(values, [["A", "B"], ["C"]], "shares of ['A', 'B', 'C'] on ranks 0 and 1")


SPLIT_COUNTS = (1, 2, 5, 7, 9)


@case("split.doc_example")
def split_contiguous_shares(impl, world):
    """The example's rule at every world: contiguous shares in rank order, sizes differing by at most
    one, the extras going to the first ranks; together the shares are the input exactly once."""
    acc = impl.Accelerator()
    return [_split(acc, [f"item{i}" for i in range(count)]) for count in SPLIT_COUNTS if count >= world.size]


@split_contiguous_shares.check
def _contiguous(values, world):
    counts = [count for count in SPLIT_COUNTS if count >= world.size]
    for index, count in enumerate(counts):
        items = [f"item{i}" for i in range(count)]
        got = [values[rank][index] for rank in range(world.size)]
        expected = [items[a:b] for a, b in _bounds(count, world.size)]
        expect_equal(got, expected, f"shares of {count} items at world {world.label}, rank by rank")


@case("split.padding", worlds=[2])
def split_padding(impl, world):
    """``apply_padding=True``: rank 0 gets ``["A", "B"]``, rank 1 ``["C", "C"]`` (the last element repeated)."""
    acc = impl.Accelerator()
    return _split(acc, ["A", "B", "C"], apply_padding=True)


@split_padding.check
def _padded_doc_shares(values, world):
    expect_equal(values, [["A", "B"], ["C", "C"]], "padded shares of ['A', 'B', 'C'] on ranks 0 and 1")


@case("split.padding", worlds=[w for w in ANY_WORLD if w != "2"])
def split_padding_any_world(impl, world):
    """With ``apply_padding=True`` every share is as long as the longest, filled with the input's
    last element (not the share's), for every documented input type: lists, tensors (last row
    repeated), dicts (each value padded with its own last element) and tuples (the share stays a
    tuple). World 2 is the documented example's.

    Each rank checks its own share against the rule (the shares follow from the launcher's rank);
    tuples come last, so that an implementation failing on them is still checked on the rest.
    """
    acc = impl.Accelerator()
    r, n = world.rank, world.size
    count = 2 * n + 1 if n > 1 else 3

    def expected(items):
        return _padded(list(items), count, n)[r]

    items = [f"x{i}" for i in range(count)]
    expect_equal(_split(acc, items, apply_padding=True), expected(items), f"padded share of a list of {count}")
    rows = [[i, -i] for i in range(count)]
    tensor = _split(acc, torch.tensor(rows).to(acc.device), apply_padding=True)
    expect_equal(layout(tensor), f"tensor[int64][{len(expected(rows))}, 2]", f"layout of the padded share of a [{count}, 2] tensor")
    expect_equal(tensor, expected(rows), f"rows of the padded share of a [{count}, 2] tensor")
    dict_share = _split(
        acc, {"a": [f"a{i}" for i in range(count)], "b": torch.arange(count).to(acc.device)}, apply_padding=True
    )
    b_share = expected(range(count))
    expect_equal(
        layout(dict_share), {"a": layout(expected(items)), "b": f"tensor[int64][{len(b_share)}]"}, "layout of the padded dict share"
    )
    expect_equal(dict_share, {"a": expected([f"a{i}" for i in range(count)]), "b": b_share}, "values of the padded dict share")
    tuple_items = tuple(f"t{i}" for i in range(count))
    tuple_share = _split(acc, tuple_items, apply_padding=True)
    expect_true(isinstance(tuple_share, tuple), f"a tuple input gives a tuple share, got {type(tuple_share).__name__}")
    expect_equal(list(tuple_share), expected(tuple_items), f"padded share of a tuple of {count}")


@case("split.tensor_dict")
def split_tensor_dict(impl, world):
    """Tensors are split on dim 0; dicts are split value-wise (lists, tuples and tensors alike),
    keeping each value's type; a dict whose values differ in length is rejected with a clear error
    (a ValueError that speaks of length) at every world, a single process included.

    Each rank checks its own share against the rule; the rejection comes last, so an
    implementation lacking only it still has the value-wise split checked first.
    """
    acc = impl.Accelerator()
    n = world.size
    count = 2 * n + 1
    a, b = _bounds(count, n)[world.rank]
    matrix = torch.arange(count * 3).reshape(count, 3)
    tensor_share = _split(acc, matrix.to(acc.device))
    expect_equal(layout(tensor_share), layout(matrix[a:b]), f"layout of the share of a [{count}, 3] tensor")
    expect_equal(tensor_share, matrix[a:b], f"rows of the share of a [{count}, 3] tensor")
    x = torch.arange(count * 2).reshape(count, 2)
    inputs = {"prompts": [f"p{i}" for i in range(count)], "ids": tuple(range(100, 100 + count)), "x": x.to(acc.device)}
    dict_share = _split(acc, inputs)
    expected = {"prompts": [f"p{i}" for i in range(a, b)], "ids": tuple(range(100 + a, 100 + b)), "x": x[a:b]}
    expect_true(isinstance(dict_share, dict), f"a dict input gives a dict share, got {type(dict_share).__name__}")
    expect_equal(layout(dict_share), layout(expected), "layout of the dict share (keys and value types kept)")
    expect_equal(dict_share, expected, "values of the dict share")
    unequal = {"a": list(range(2 * n + 1)), "b": list(range(n + 1))}
    error = expect_raises(
        lambda: _split(acc, unequal),
        ValueError,
        f"split_between_processes of a dict whose values have lengths {2 * n + 1} and {n + 1}",
    )
    expect_true("length" in str(error).lower(), f"the error should say the values' lengths differ: {error}")


@case("split.fewer_inputs_than_ranks", worlds=[w for w in ANY_WORLD if w != "1"])
def split_fewer_inputs_than_ranks(impl, world):
    """``num_processes - 1`` inputs (3 on 4 ranks in the document): without padding the last rank
    gets an empty share and the others one item each; with padding every rank gets one item,
    the last rank the input's last one. Lists and tensors."""
    acc = impl.Accelerator()
    count = world.size - 1
    items = [chr(ord("A") + i) for i in range(count)]
    tensor = torch.tensor([10 * (i + 1) for i in range(count)])
    plain_list = _split(acc, items)
    padded_list = _split(acc, items, apply_padding=True)
    plain_tensor = _split(acc, tensor.to(acc.device))
    padded_tensor = _split(acc, tensor.to(acc.device), apply_padding=True)
    return {
        "list": plain_list,
        "padded_list": padded_list,
        "tensor": layout(plain_tensor),
        "tensor_values": plain(plain_tensor),
        "padded_tensor": layout(padded_tensor),
        "padded_tensor_values": plain(padded_tensor),
    }


@split_fewer_inputs_than_ranks.check
def _one_each_or_empty(values, world):
    n = world.size
    count = n - 1
    items = [chr(ord("A") + i) for i in range(count)]
    numbers = [10 * (i + 1) for i in range(count)]
    expect_equal([v["list"] for v in values], [[item] for item in items] + [[]], f"shares of {count} items on {n} ranks")
    expect_equal(
        [v["padded_list"] for v in values], [[item] for item in items] + [[items[-1]]], f"padded shares of {count} items on {n} ranks"
    )
    expect_equal(
        [v["tensor"] for v in values],
        ["tensor[int64][1]"] * count + ["tensor[int64][0]"],
        f"layout of the shares of a tensor of {count} on {n} ranks",
    )
    expect_equal([v["tensor_values"] for v in values], [[x] for x in numbers] + [[]], f"shares of a tensor of {count} on {n} ranks")
    expect_equal(
        [v["padded_tensor"] for v in values],
        ["tensor[int64][1]"] * n,
        f"layout of the padded shares of a tensor of {count} on {n} ranks",
    )
    expect_equal(
        [v["padded_tensor_values"] for v in values],
        [[x] for x in numbers] + [[numbers[-1]]],
        f"padded shares of a tensor of {count} on {n} ranks",
    )
