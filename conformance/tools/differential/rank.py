"""What runs inside a simulated rank: each probe under the reference, then under the candidate.

The driver's rank pool calls :func:`run_one` once per probe; both
implementations live in the rank (the process group one of them creates is
kept for the other), and their observations return as plain data.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import io
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
    """Import both implementations once per rank (the pool's setup hook), pick DeepSpeed's accelerator quietly,
    then keep them out of the garbage collector's scans for the rank's life (see runner.frozen_heap)."""
    subjects()
    deepspeed_accelerator_quietly()
    gc.collect()
    gc.freeze()


def deepspeed_accelerator_quietly() -> None:
    """DeepSpeed logs "Setting accelerator to CPU" on stdout once a process, the first time anything asks for its
    accelerator; HF accelerate asks in some calls (``autocast``, ``get_state_dict``) that accelerate_ref makes
    without DeepSpeed, so which side prints it depends only on which probe asked first. Asked before any probe
    (here, and in the driver for its own world: ``runner._in_process``), it prints on neither. Without deepspeed
    installed, nothing."""
    if importlib.util.find_spec("deepspeed") is None:
        return
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        from deepspeed.accelerator import get_accelerator

        get_accelerator()


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
