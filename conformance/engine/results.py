"""Statuses and results of case runs."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any, Callable


class Status(str, enum.Enum):
    """Outcome of one case at one world, kept apart as wpt does."""

    PASS = "PASS"
    FAIL = "FAIL"  # an assertion about the documented rule did not hold
    ERROR = "ERROR"  # an unexpected exception
    HANG = "HANG"  # the case did not finish within its timeout
    CRASH = "CRASH"  # a rank process died
    NOT_SUPPORTED = "NOT_SUPPORTED"  # the implementation lacks an optional feature
    XFAIL = "XFAIL"  # failed as the implementation's manifest says it does

    @property
    def symbol(self) -> str:
        return _SYMBOLS[self]

    @property
    def is_problem(self) -> bool:
        """A result that makes the run fail."""
        return self in (Status.FAIL, Status.ERROR, Status.HANG, Status.CRASH)


_SYMBOLS = {
    Status.PASS: ".",
    Status.FAIL: "F",
    Status.ERROR: "E",
    Status.HANG: "H",
    Status.CRASH: "C",
    Status.NOT_SUPPORTED: "s",
    Status.XFAIL: "x",
}

#: When ranks disagree, the case takes the first of these that any rank reported.
RANK_PRECEDENCE = (Status.FAIL, Status.ERROR, Status.NOT_SUPPORTED, Status.PASS)


@dataclass
class RankReport:
    """What one rank said about one case run."""

    rank: int
    status: Status
    message: str = ""
    #: Time the case took inside this rank.
    duration_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "status": self.status.value, "message": self.message, "duration_s": self.duration_s}


@dataclass
class CaseResult:
    """One case at one world on one backend against one implementation."""

    id: str
    case: str
    status: Status
    world: str
    backend: str
    impl: str
    duration_s: float
    message: str = ""
    ranks: list[RankReport] = field(default_factory=list)
    #: Stacks of ranks still running at a HANG, by rank.
    stacks: dict[int, str] = field(default_factory=dict)
    #: At a HANG or CRASH: the collective each rank was in and who never joined
    #: (``simulators.flight_recorder.Diagnosis.to_json``), from torch's Flight Recorder.
    collectives: dict[str, Any] = field(default_factory=dict)
    #: What each rank wrote (stdout and stderr) while the case ran, its last lines; ranks that wrote nothing left out.
    output: dict[int, str] = field(default_factory=dict)
    #: Manifest reason when the status is XFAIL, or when a listed deviation passed.
    manifest_reason: str = ""
    unexpected_pass: bool = False

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        data["ranks"] = [rank.to_json() for rank in self.ranks]
        data["stacks"] = {str(rank): text for rank, text in self.stacks.items()}
        data["output"] = {str(rank): text for rank, text in self.output.items()}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CaseResult":
        fields = dict(data)
        fields["status"] = Status(fields["status"])
        fields["ranks"] = [
            RankReport(r["rank"], Status(r["status"]), r.get("message", ""), r.get("duration_s", 0.0)) for r in fields.get("ranks", [])
        ]
        fields["stacks"] = {int(rank): text for rank, text in fields.get("stacks", {}).items()}
        fields["output"] = {int(rank): text for rank, text in fields.get("output", {}).items()}
        return cls(**fields)


#: How a backend hands each result to the runner as the case ends.
Emit = Callable[[CaseResult], None]
