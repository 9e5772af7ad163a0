"""Merging what every rank said about a case into one result.

A case passes only if every rank passed and its driver-side check (if any)
holds on the per-rank values. When ranks disagree the case takes the first
status of `RANK_PRECEDENCE` that any rank reported. When some ranks failed
and the rest then hung waiting for them, the failure is the cause and is
reported, with the stacks of the ranks that were stopped.
"""

from __future__ import annotations

import traceback
from typing import Any

from .case import Case, WorldInfo
from .results import RANK_PRECEDENCE, CaseResult, RankReport, Status


def rank_reports(replies: dict[int, dict[str, Any]]) -> list[RankReport]:
    """One report per rank that replied, in rank order."""
    return [
        RankReport(rank, Status(reply["status"]), reply.get("message", ""), round(reply.get("duration_s", 0.0), 4))
        for rank, reply in sorted(replies.items())
    ]


def merge_replies(case: Case, world: WorldInfo, replies: dict[int, dict[str, Any]]) -> tuple[Status, str]:
    """Status and message of a case whose ranks all replied."""
    reports = rank_reports(replies)
    status = next(s for s in RANK_PRECEDENCE if any(r.status == s for r in reports))
    if status != Status.PASS:
        return status, _join(r.message for r in reports if r.status == status)
    if case.check_function is None:
        return Status.PASS, ""
    values = [replies[rank]["value"] for rank in sorted(replies)]
    try:
        case.check_function(values, world)
    except AssertionError as error:
        return Status.FAIL, f"across ranks: {error or traceback.format_exc(limit=-1)}"
    except Exception:
        return Status.ERROR, "driver-side check raised:\n" + traceback.format_exc(limit=-4)
    return Status.PASS, ""


def merge_incomplete(
    replies: dict[int, dict[str, Any]], missing: list[int], cause: Status, detail: str
) -> tuple[Status, str]:
    """Status and message when ``missing`` ranks hung or died.

    A failure reported by a rank that did reply explains the others' hang
    and wins; otherwise the case is the ``cause`` (HANG or CRASH).
    """
    failed = [r for r in rank_reports(replies) if r.status in (Status.FAIL, Status.ERROR)]
    note = f"ranks {missing} did not finish ({cause.value.lower()})"
    if failed and cause == Status.HANG:
        first = next(s for s in RANK_PRECEDENCE if any(r.status == s for r in failed))
        return first, _join([*(r.message for r in failed if r.status == first), note])
    return cause, _join([note, detail])


def result(
    case: Case,
    world: WorldInfo,
    backend: str,
    impl: str,
    status: Status,
    message: str,
    duration_s: float,
    replies: dict[int, dict[str, Any]],
    stacks: dict[int, str] | None = None,
    output: dict[int, str] | None = None,
) -> CaseResult:
    """The result of ``case``; ``output`` is what each rank wrote while it ran (empty ones dropped)."""
    return CaseResult(
        id=case.id,
        case=case.name,
        status=status,
        world=world.label,
        backend=backend,
        impl=impl,
        duration_s=round(duration_s, 4),
        message=message,
        ranks=rank_reports(replies),
        stacks=dict(stacks or {}),
        output={rank: text for rank, text in sorted((output or {}).items()) if text.strip()},
    )


def _join(parts: Any) -> str:
    return "\n".join(part for part in parts if part)
