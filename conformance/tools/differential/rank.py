"""What runs inside a simulated rank: each probe under the reference, then under the candidate.

The driver's rank pool calls :func:`run_one` once per probe; both
implementations live in the rank (the process group one of them creates is
kept for the other), and their observations return as plain data.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

from .coverage import Recorder
from .observe import ClassIndex
from .probe import Subject, find, run_probe

REFERENCE_ENV = "DIFFERENTIAL_REFERENCE"
CANDIDATE_ENV = "DIFFERENTIAL_CANDIDATE"
_subjects: dict[str, Subject] = {}


def setup() -> None:
    """Import both implementations once per rank (the pool's setup hook), then keep them out of the garbage
    collector's scans for the rank's life (see runner.frozen_heap)."""
    subjects()
    gc.collect()
    gc.freeze()


def subjects() -> dict[str, Subject]:
    if not _subjects:
        reference, candidate = os.environ[REFERENCE_ENV], os.environ[CANDIDATE_ENV]
        classes = ClassIndex.of_public_api()
        _subjects["reference"] = Subject(reference, reference, classes)
        _subjects["candidate"] = Subject(candidate, reference, classes)
    return _subjects


def run_one(name: str, family: str, shared_dir: str, record_calls: bool) -> dict[str, Any]:
    """Run probe ``name`` under the reference then the candidate; the two observation lists (and the
    reference's calls when ``record_calls``)."""
    found = find(name)
    rank, size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    reply: dict[str, Any] = {}
    for role, subject in subjects().items():
        folder = Path(shared_dir) / role
        folder.mkdir(parents=True, exist_ok=True)
        recorder = Recorder(subject.impl.module if role == "reference" and record_calls else None)
        with recorder:
            reply[role] = run_probe(found, subject, tmp=folder, rank=rank, world_size=size, family=family,
                                    settle=_barrier)
        if recorder.active:
            reply["calls"] = recorder.calls
        _barrier()  # the candidate's collectives never meet the reference's of a slower rank
    return reply


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
