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

import pytest

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
