"""Which collective each rank of a hung world is in, read from torch's Flight Recorder.

torch 2.13 records every gloo collective a rank enters (``TORCH_FR_BUFFER_SIZE``
set; :mod:`simulators.watchdog` collects the dumps): per entry the process
group, its sequence number in that group, the op (``gloo:all_reduce``), the
input shapes and dtypes. From one dump per rank, taken at a hang,
:func:`diagnose` finds per rank the last collective it entered since the
target started and, per process group, the furthest collective any rank
entered and the ranks that never joined it (they are behind it, or in no
collective of that group at all). Ranks that entered the same sequence
number with a different op are named as a mismatch, and so are ranks with
other shapes or dtypes in an op every rank calls with equal ones
(``SAME_SHAPES``; an all-to-all or a gather may take different shapes).

Members of a group: the whole world for the default group (``default_pg``);
for another group, the ranks that entered any of its collectives.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

DEFAULT_GROUP = "default_pg"
#: Ops (the name after the backend's prefix, ``gloo:all_reduce``) whose inputs have one shape and dtype on every rank.
SAME_SHAPES = frozenset({"all_reduce", "allreduce", "broadcast", "reduce", "barrier", "_allgather_base",
                         "all_gather_into_tensor", "_reduce_scatter_base", "reduce_scatter_tensor"})
#: ``--debug-collectives``: torch checks every collective's op and shapes across ranks before running it,
#: so a mismatch fails at once with torch's own error naming the ranks, instead of hanging.
DEBUG_ENV = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}


@dataclass(frozen=True)
class CollectiveCall:
    """One collective a rank entered: group, sequence number in it, op, input shapes and dtypes."""

    group: str
    seq: int
    op: str
    sizes: tuple
    dtypes: tuple

    def describe(self) -> str:
        sizes = ", ".join("x".join(map(str, size)) or "scalar" for size in self.sizes) or "-"
        return f"#{self.seq} {self.op} shapes [{sizes}] dtypes [{', '.join(self.dtypes) or '-'}] in group {self.group}"


@dataclass
class GroupVerdict:
    """The furthest collective of one group and who is in it, who never joined it, who disagrees."""

    group: str
    call: CollectiveCall
    entered: list[int]
    never_joined: list[int]
    mismatched: list[int]


@dataclass
class Diagnosis:
    """Per rank its last collective (None: none since the start), per group the verdict, the ranks without a dump."""

    last: dict[int, CollectiveCall | None]
    groups: list[GroupVerdict]
    #: Ranks with no dump (they had exited, or did not answer in time).
    unrecorded: list[int]

    def to_json(self) -> dict[str, Any]:
        return {
            "last": {str(rank): asdict(call) if call else None for rank, call in self.last.items()},
            "groups": [asdict(verdict) for verdict in self.groups],
            "unrecorded": self.unrecorded,
            "text": self.text(),
        }

    def text(self) -> str:
        """A readable account: one line per set of ranks in the same collective, one per group verdict."""
        lines = ["collectives (torch Flight Recorder):"]
        by_call: dict[CollectiveCall | None, list[int]] = {}
        for rank, call in sorted(self.last.items()):
            by_call.setdefault(call, []).append(rank)
        for call, ranks in by_call.items():
            lines.append(f"  {_ranks(ranks)}: " + (f"last entered {call.describe()}" if call else "entered no collective"))
        if self.unrecorded:
            lines.append(f"  {_ranks(self.unrecorded)}: no record (not running, or no answer in time)")
        for verdict in self.groups:
            line = f"  group {verdict.group}: {verdict.call.op} #{verdict.call.seq} entered by {_ranks(verdict.entered)}"
            if verdict.never_joined:
                line += f"; never joined by {_ranks(verdict.never_joined)}"
            if verdict.group == DEFAULT_GROUP and self.unrecorded:
                line += f"; no record from {_ranks(self.unrecorded)}"
            if verdict.mismatched:
                line += f"; entered with another op or shapes by {_ranks(verdict.mismatched)}"
            lines.append(line)
        return "\n".join(lines)


def diagnose(records: dict[int, dict], world_size: int, since_ns: int = 0) -> Diagnosis:
    """The diagnosis from each rank's Flight Recorder dump, counting entries created at or after ``since_ns``.

    ``since_ns`` (wall clock, ns) keeps out the collectives of earlier targets,
    whose process groups reuse the same names and sequence numbers.
    """
    calls = {rank: _calls(dump, since_ns) for rank, dump in records.items()}
    last = {rank: (rank_calls[-1] if rank_calls else None) for rank, rank_calls in calls.items()}
    groups = sorted({call.group for rank_calls in calls.values() for call in rank_calls},
                    key=lambda group: (group != DEFAULT_GROUP, group))
    verdicts = []
    for group in groups:
        in_group = {rank: [c for c in rank_calls if c.group == group] for rank, rank_calls in calls.items()}
        latest = {rank: group_calls[-1] for rank, group_calls in in_group.items() if group_calls}
        top = max(call.seq for call in latest.values())
        at_top = {rank: call for rank, call in latest.items() if call.seq == top}
        reference = at_top[min(at_top)]
        members = sorted(records) if group == DEFAULT_GROUP else sorted(latest)
        verdicts.append(GroupVerdict(
            group=group,
            call=reference,
            entered=sorted(at_top),
            never_joined=[rank for rank in members if rank not in at_top],
            mismatched=sorted(rank for rank, call in at_top.items() if _mismatch(call, reference)),
        ))
    return Diagnosis(last, verdicts, [rank for rank in range(world_size) if rank not in records])


def _mismatch(call: CollectiveCall, reference: CollectiveCall) -> bool:
    """Whether two ranks' calls at one sequence number of a group cannot be the same collective."""
    if call.op != reference.op:
        return True
    return call.op.split(":")[-1] in SAME_SHAPES and (call.sizes, call.dtypes) != (reference.sizes, reference.dtypes)


def _calls(dump: dict, since_ns: int) -> list[CollectiveCall]:
    """The collectives in one dump created at or after ``since_ns``, in the order the rank entered them."""
    entries = sorted(dump.get("entries", []), key=lambda entry: entry.get("record_id", 0))
    calls = []
    for entry in entries:
        if entry.get("time_created_ns", 0) < since_ns or entry.get("is_p2p"):
            continue
        group = entry.get("process_group") or ("", "")
        calls.append(CollectiveCall(
            group=group[1] if group[1] not in ("", "undefined") else f"pg{group[0]}",
            seq=int(entry.get("collective_seq_id", 0)),
            op=str(entry.get("profiling_name", "?")),
            sizes=tuple(tuple(size) for size in entry.get("input_sizes", [])),
            dtypes=tuple(entry.get("input_dtypes", [])),
        ))
    return calls


def _ranks(ranks: list[int]) -> str:
    """``rank 3``, or ``ranks 0-2, 5`` for a sorted list."""
    spans: list[list[int]] = []
    for rank in ranks:
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    return f"rank {text}" if len(ranks) == 1 else f"ranks {text}"
