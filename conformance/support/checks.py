"""Assertion helpers whose failure messages explain themselves.

Each raises AssertionError with what was checked, what was expected and
what the implementation produced, so a FAIL in the report reads on its own.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence


def expect_equal(got: Any, expected: Any, what: str) -> None:
    """``got == expected``, compared as plain Python values (tensors via ``tolist``)."""
    got_plain, expected_plain = plain(got), plain(expected)
    if got_plain != expected_plain:
        raise AssertionError(f"{what}: expected {expected_plain!r}, got {got_plain!r}")


def expect_true(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(what)


def expect_close(got: Any, expected: Any, what: str) -> None:
    """``got`` equals ``expected`` within the tolerances torch's own tests use for their dtype
    (``torch.testing.assert_close``'s defaults), compared on ``expected``'s device: where the documents promise
    equivalent results (compiled and eager code, another kernel), not bit-equal ones."""
    import torch

    try:
        torch.testing.assert_close(got.to(expected.device), expected)
    except AssertionError as error:
        raise AssertionError(f"{what}: {' '.join(str(error).split())}") from None


def expect_tensor(got: Any, expected: Any, what: str) -> None:
    """``got`` is a tensor with ``expected``'s shape and values."""
    import torch

    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"{what}: expected a tensor, got {type(got).__name__} {got!r}")
    expected = torch.as_tensor(expected)
    if tuple(got.shape) != tuple(expected.shape):
        raise AssertionError(
            f"{what}: expected shape {list(expected.shape)}, got {list(got.shape)} (values {got.tolist()!r})"
        )
    if got.detach().cpu().tolist() != expected.tolist():
        raise AssertionError(f"{what}: expected {expected.tolist()!r}, got {got.detach().cpu().tolist()!r}")


def expect_ranks(values: Sequence[Any], predicate_holds: Iterable[bool], what: str) -> None:
    """For each rank, ``values[rank]`` is truthy exactly where ``predicate_holds`` says."""
    expected = list(predicate_holds)
    got = [bool(v) for v in values]
    if got != expected:
        wrong = [rank for rank, (g, e) in enumerate(zip(got, expected)) if g != e]
        raise AssertionError(
            f"{what}: expected true on ranks {[r for r, e in enumerate(expected) if e]}, "
            f"got true on ranks {[r for r, g in enumerate(got) if g]} (wrong on ranks {wrong})"
        )


def plain(value: Any) -> Any:
    """Tensors and nested containers turned into plain Python values for comparison."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu().tolist()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    return value


def layout(value: Any) -> Any:
    """``value`` with every tensor replaced by ``"tensor[<dtype>]<shape>"`` (containers kept).

    Compared with `expect_equal`, it checks that leaves are tensors of the
    right dtype and shape and that lists stay lists, tuples tuples, dicts dicts.
    """
    import torch

    if isinstance(value, torch.Tensor):
        return f"tensor[{str(value.dtype).replace('torch.', '')}]{list(value.shape)}"
    if isinstance(value, dict):
        return {k: layout(v) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(layout(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(layout(v) for v in value)
    return f"<{type(value).__name__}>"


def expect_raises(function: Any, exceptions: Any, what: str) -> BaseException:
    """``function()`` raises one of ``exceptions``; returns the exception."""
    try:
        returned = function()
    except exceptions as error:
        return error
    names = exceptions.__name__ if isinstance(exceptions, type) else " or ".join(e.__name__ for e in exceptions)
    try:
        shown = repr(plain(returned))
    except Exception:  # e.g. a namedtuple, which plain() cannot rebuild
        shown = repr(returned)
    raise AssertionError(f"{what}: expected {names}, got a normal return of {shown}")


def shapes_mentioned(text: str) -> set[tuple[int, ...]]:
    """Every bracketed group of integers in ``text`` (``[2, 3]``, ``(2, 3)``, ``torch.Size([2, 3])``) as a tuple."""
    import re

    groups = re.findall(r"[\[(]\s*(\d+(?:\s*,\s*\d+)*)\s*,?\s*[\])]", text)
    return {tuple(int(n) for n in group.split(",")) for group in groups}
