"""A rank that raises under ``debug_launcher`` ends the launch as HF 1.15's does (catalog launch.debug_launcher).

HF 1.15 forks with ``torch.multiprocessing.start_processes``, so the launch raises torch's
``ProcessRaisedException`` carrying the failing rank's traceback; accelerate_ref's launcher forks the same way.
The differential probes (``conformance/tools/differential/probes/launchers.py``) check what each launcher hands to
torch without forking; this test runs real forks of both implementations, so it is ``extended``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from accelerate_ref.utils._other.ports import get_free_port

_SCRIPT = '''
import importlib, sys
impl = importlib.import_module(sys.argv[1])

def train(tag):
    accelerator = impl.Accelerator()
    if accelerator.process_index == 1:
        raise ValueError(f"rank one fails ({tag}, {accelerator.num_processes} processes)")

try:
    impl.debug_launcher(train, ("debug",), num_processes=2)
except Exception as error:
    print("RAISED", type(error).__module__, type(error).__name__)
    print(error)
'''


@pytest.mark.extended
@pytest.mark.parametrize("impl", ["accelerate", "accelerate_ref"])
def test_a_failing_rank_ends_a_debug_launch_with_process_raised_exception(impl: str) -> None:
    done = subprocess.run([sys.executable, "-c", _SCRIPT, impl], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "RAISED torch.multiprocessing.spawn ProcessRaisedException" in done.stdout, done.stdout[-2000:]
    assert "-- Process 1 terminated with the following error:" in done.stdout
    assert "ValueError: rank one fails (debug, 2 processes)" in done.stdout


_LAUNCH_SCRIPT = textwrap.dedent('''
    import functools, importlib, os, sys
    from pathlib import Path

    def record(folder, tag, value):
        import torch.distributed as dist

        if dist.is_initialized():  # debug_launcher's ranks (HF's and ours): one that returned at once could
            dist.barrier()         # close its gloo pair while the other still connects ("Connection closed by peer")
        Path(folder, f"{os.getpid()}.txt").write_text(f"{tag} {value}")

    root, port = sys.argv[1:3]
    for impl, launcher in (argument.split(":") for argument in sys.argv[3:]):
        folder = Path(root, f"{impl}-{launcher}")
        folder.mkdir()
        options = {"use_port": port} if launcher == "notebook_launcher" else {}
        try:
            launch = getattr(importlib.import_module(f"{impl}.launchers"), launcher)
            launch(functools.partial(record, folder, "partial"), args=(3,), num_processes=2, **options)
        except Exception as error:
            print(impl, launcher, f"{type(error).__name__}: {error}")
''')


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")
def test_launchers_take_a_partial(tmp_path: Path) -> None:
    """``debug_launcher(functools.partial(...))`` runs on both ranks as HF's does; so does ``notebook_launcher``'s,
    where HF 1.15 hands the partial to torch's elastic agent, which fails on its missing ``__name__``."""
    launches = ["accelerate:debug_launcher", "accelerate_ref:debug_launcher", "accelerate_ref:notebook_launcher"]
    run = subprocess.run([sys.executable, "-c", _LAUNCH_SCRIPT, str(tmp_path), str(get_free_port()), *launches],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    failures = [line for line in run.stdout.splitlines() if not line.startswith("Launching training on")]
    assert failures == [], "a launcher refused the partial"
    for launch in launches:
        records = sorted(path.read_text() for path in (tmp_path / launch.replace(":", "-")).iterdir())
        assert records == ["partial 3", "partial 3"], launch
