"""Running a probe script once with torch's own rules and once with a simulator rule installed."""
from __future__ import annotations

import json
import subprocess
import sys


def torch_and_simulator(script: str, timeout: float) -> dict[str, dict]:
    """The JSON ``script`` prints last, run in a process of its own with ``torch`` and with ``simulator`` as its
    argument (the script installs the simulator's rule for the second), by that argument."""
    seen = {}
    for rules in ("torch", "simulator"):
        done = subprocess.run([sys.executable, "-c", script, rules], capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"the probe with {rules}'s rules failed:\n{done.stderr[-3000:]}"
        seen[rules] = json.loads(done.stdout.splitlines()[-1])
    return seen
