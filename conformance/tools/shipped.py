"""HF accelerate's own distributed self-test scripts, run on HF and on an implementation under the same launch.

``python -m conformance shipped --impl accelerate_ref`` runs every script
HF ships in its wheel (``accelerate/test_utils/scripts/test_*.py`` and
``external_deps/test_*.py``) on the simulator, once with HF accelerate and
once with ``import accelerate`` switched to the implementation
(:mod:`conformance.tools.switch`), and prints a table: script | HF | impl | note.

Rules:
- both runs of a script go through :mod:`conformance.tools.switch` with the same
  world, environment, timeout and a fresh working folder each (``--impl
  accelerate`` switches nothing), so the only difference is the import;
- a script runs at 2 ranks on CPU ranks (gloo on loopback) with
  ``ACCELERATE_USE_CPU=1``, the variable HF needs to see MULTI_CPU under a
  torchrun-style launch (as :class:`conformance.engine.backends.SimBackend` sets
  it), and ``OMP_NUM_THREADS=1``; a script HF itself runs as one process
  that starts its own ranks (``test_notebook.py``) runs as HF's test runs it
  (:data:`LAUNCH_AS_HF_DOES`);
- a run is ``pass`` (every rank exited 0), ``fail`` (a rank exited non-zero:
  the note quotes its last exception line) or ``hang`` (past the timeout:
  every rank is stopped); a script known to race (:data:`RACES`) is run
  once more after a hang, and the second run counts;
- the run fails (exit 1) when a script passes on HF and not on the
  implementation.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

from simulators.launcher import LaunchResult, launch
from simulators.topology import World

from .switch import ALIAS, hf_package_dir

#: Seconds one script may run on one implementation before it is a hang.
DEFAULT_SCRIPT_TIMEOUT = 150.0
#: Every rank's environment (see the module's rules).
RANK_ENV = {"ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
SWITCH = Path(__file__).with_name("switch.py")


@dataclass(frozen=True)
class Launch:
    """How one script is started: ranks of the simulated world and extra environment."""

    ranks: int = 2
    env: dict[str, str] = field(default_factory=dict)


#: Scripts HF's own tests start otherwise than at N ranks: test_notebook.py runs as one process
#: whose notebook_launcher starts ACCELERATE_NUM_PROCESSES ranks (HF's tests/test_multigpu.py).
LAUNCH_AS_HF_DOES = {"test_notebook.py": Launch(ranks=1, env={"ACCELERATE_NUM_PROCESSES": "2"})}

#: Scripts whose own test races, on either implementation, run once more after a hang; why:
RACES = {
    "test_notebook.py": "test_fault_tolerant's workers share a queue: a rank that finds it empty (its partner holds "
                        "the last item) returns, and the partner that then gets 0 waits forever in "
                        "init_process_group for it",
}

_ALONE = ("HF's PartialState() without cpu=True ignores ACCELERATE_USE_CPU, so each CPU rank is "
          "DistributedType.NO, one process")

#: Why a script does not pass, or passes without testing much, on HF itself on CPU, read from its
#: traceback or source; shown beside the observed error line.
KNOWN_ON_CPU = {
    "external_deps/test_checkpointing.py": "needs `evaluate`, `datasets` and the Hub (GLUE MRPC, bert-base-cased)",
    "external_deps/test_ds_alst_ulysses_sp.py": "needs DeepSpeed and a Hub model",
    "external_deps/test_ds_multiple_model.py": "needs `evaluate`, `datasets`, DeepSpeed and the Hub",
    "external_deps/test_metrics.py": "needs `evaluate`, `datasets` and the Hub (GLUE MRPC)",
    "external_deps/test_peak_memory_usage.py": "needs `datasets` and the Hub (GLUE MRPC, bert-base-cased)",
    "external_deps/test_performance.py": "needs `evaluate`, `datasets` and the Hub (GLUE MRPC, bert-base-cased)",
    "external_deps/test_pippy.py": "passes without testing: on CPU it prints 'Less than two GPUs found, not running tests!'",
    "external_deps/test_zero3_integration.py": "needs DeepSpeed, the NCCL backend and a Hub model (sshleifer/tiny-gpt2)",
    "test_cli.py": "reports the GPUs it sees (0 on CPU); nothing to fail",
    "test_ops.py": f"HF passes alone: {_ALONE}; accelerate_ref runs the checks at 2 processes",
    "test_notebook.py": f"HF's workers run alone: {_ALONE}",
    "test_ddp_comm_hook.py": "its reference model is DistributedDataParallel(device_ids=[local rank]), which torch "
                             "refuses for a CPU module",
    "test_distributed_data_loop.py": "HF joins uneven inputs on GPUs only: on CPU ranks join_uneven_inputs warns and "
                                     "runs without torch's Join, so the rank with the extra batch waits in DDP's "
                                     "forward while the other waits at the barrier (accelerate_ref joins on gloo, "
                                     "catalog join.uneven_inputs)",
    "test_merge_weights.py": "HF's FSDP is a GPU distributed type: on CPU ranks the Accelerator stays MULTI_CPU and "
                             "wraps DDP, so save_fsdp_model finds no FSDP module (KeyError: None); accelerate_ref "
                             "shards on CPU (fully_shard) and fails later: its model.state_dict() holds DTensors "
                             "where FSDP1's holds full tensors",
}

_EXCEPTION_LINE = re.compile(r"^(?:\[rank \d+\] )?([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Failure)\b.*)$")


@dataclass
class Outcome:
    """One script on one implementation."""

    status: str  # "pass", "fail" or "hang"
    seconds: float
    error: str = ""  # the failing rank's last exception line, or the ranks still running at a hang
    retried: bool = False  # the first run hung

    def cell(self) -> str:
        return f"{self.status} ({self.seconds:.1f} s{', after a hang' if self.retried else ''})"


@dataclass
class Row:
    """One script: its outcome on HF and on the implementation."""

    script: str
    hf: Outcome
    impl: Outcome

    @property
    def regression(self) -> bool:
        """Passes on HF and not on the implementation."""
        return self.hf.status == "pass" and self.impl.status != "pass"

    def note(self) -> str:
        parts = [KNOWN_ON_CPU.get(self.script, "")]
        if self.hf.retried or self.impl.retried:
            parts.append(f"hung once, run again: {RACES[Path(self.script).name]}")
        if self.hf.status != "pass":
            parts.append(f"HF: {_short(self.hf.error)}")
        if self.impl.status != "pass" and self.impl.error != self.hf.error:
            parts.append(f"impl: {_short(self.impl.error)}")
        return "; ".join(part for part in parts if part)


def _short(error: str, limit: int = 160) -> str:
    return error if len(error) <= limit else error[:limit - 1] + "…"


def scripts_dir() -> Path:
    """HF's scripts folder in its installed wheel."""
    return hf_package_dir() / "test_utils" / "scripts"


def shipped_scripts() -> list[str]:
    """Every ``test_*.py`` of the wheel's scripts folder and its ``external_deps``, relative to the folder."""
    root = scripts_dir()
    return sorted(str(path.relative_to(root)) for pattern in ("test_*.py", "external_deps/test_*.py")
                  for path in root.glob(pattern))


def last_exception(output: str) -> str:
    """The last line of ``output`` that starts like an exception (``ValueError: ...``), else its last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    found = [match.group(1) for line in lines if (match := _EXCEPTION_LINE.match(line))]
    return (found or lines or ["(no output)"])[-1][:300]


def _outcome(result: LaunchResult) -> Outcome:
    if result.status == "ok":
        return Outcome("pass", result.duration_s)
    if result.status == "timeout":
        return Outcome("hang", result.duration_s, f"timed out; ranks still running: {result.running}")
    tail = result.output_tail.get(result.failed_rank, "")
    return Outcome("fail", result.duration_s, last_exception(tail))


def run_script(script: str, impl: str, timeout: float, log: Path | None = None) -> Outcome:
    """Run one shipped script (relative to :func:`scripts_dir`) switched to ``impl`` at its launch (see :data:`RACES`).

    The ranks' output goes to ``log`` (or nowhere); the rank processes are
    always stopped before this returns.
    """
    if log is not None:
        log.unlink(missing_ok=True)
    outcome = _run_once(script, impl, timeout, log)
    if outcome.status == "hang" and Path(script).name in RACES:
        outcome = _run_once(script, impl, timeout, log)
        outcome.retried = True
    return outcome


def _run_once(script: str, impl: str, timeout: float, log: Path | None) -> Outcome:
    how = LAUNCH_AS_HF_DOES.get(Path(script).name, Launch())
    with tempfile.TemporaryDirectory(prefix="shipped-") as workdir, _output_to(log):
        result = launch(
            [str(SWITCH), "--impl", impl, str(scripts_dir() / script)],
            World.of(how.ranks),
            timeout=timeout,
            env={**RANK_ENV, **how.env},
            cwd=workdir,
        )
    return _outcome(result)


@contextlib.contextmanager
def _output_to(log: Path | None) -> Iterator[None]:
    """Send this process's stdout and stderr (where the launcher copies the ranks' lines) to the end of ``log``."""
    with open(log if log else os.devnull, "a", encoding="utf-8") as sink:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            yield


def run_all(impl: str, scripts: Sequence[str], timeout: float, logs: Path | None = None,
            progress: Callable[[str], None] = print) -> list[Row]:
    """Each script on HF then on ``impl``; ``progress`` gets a line per finished row."""
    rows = []
    for script in scripts:
        outcomes = []
        for name in (ALIAS, impl):
            log = logs / f"{script.replace('/', '__')}.{name}.log" if logs else None
            outcomes.append(run_script(script, name, timeout, log))
        rows.append(Row(script, *outcomes))
        progress(f"{script}: HF {outcomes[0].cell()}, {impl} {outcomes[1].cell()}")
    return rows


def table(rows: Sequence[Row], impl: str) -> str:
    """The Markdown table: script | HF | impl | note."""
    lines = [f"| script | HF | {impl} | note |", "|---|---|---|---|"]
    for row in rows:
        note = row.note().replace("|", "\\|")
        lines.append(f"| `{row.script}` | {row.hf.cell()} | {row.impl.cell()} | {note} |")
    return "\n".join(lines)


def main(impl: str, patterns: Sequence[str], timeout: float, logs: str | None, markdown: str | None) -> int:
    """``python -m conformance shipped``: exit 0 when every script that passes on HF passes on ``impl``."""
    scripts = [s for s in shipped_scripts() if not patterns or any(p in s for p in patterns)]
    if not scripts:
        print("conformance shipped: no script matches -k", file=sys.stderr)
        return 5
    log_dir = Path(logs) if logs else None
    if log_dir:
        log_dir.mkdir(parents=True, exist_ok=True)
    rows = run_all(impl, scripts, timeout, log_dir, progress=lambda line: print(line, file=sys.stderr, flush=True))
    text = table(rows, impl)
    print(text)
    if markdown:
        Path(markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(markdown).write_text(text + "\n", encoding="utf-8")
    regressions = [row.script for row in rows if row.regression]
    if regressions:
        print(f"{len(regressions)} script(s) pass on HF and not on {impl}: {', '.join(regressions)}", file=sys.stderr)
    return 1 if regressions else 0
