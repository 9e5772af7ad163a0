"""The GPU runner job (issue 32): `.github/workflows/gpu.yml` runs the README's commands, and they are the Makefile's.

CI here has no GPU runner: these tests hold the workflow to what the README documents, so the two cannot drift.
"""

from __future__ import annotations

import itertools
import re
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "gpu.yml"
IMPLS = {"accelerate_ref", "accelerate"}
REPORT_SUFFIXES = ("json", "xml", "md")


def _jobs() -> dict:
    return yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))["jobs"]


def _expanded(text: str, combination: dict[str, str]) -> str:
    """``text`` with each ``${{ matrix.<key> }}`` replaced by the combination's value."""
    return re.sub(r"\$\{\{\s*matrix\.(\w+)\s*\}\}", lambda m: combination[m.group(1)], text)


def _combinations(job: dict) -> list[dict[str, str]]:
    matrix = job.get("strategy", {}).get("matrix", {})
    keys = list(matrix)
    return [dict(zip(keys, values)) for values in itertools.product(*(matrix[key] for key in keys))]


def _readme_commands() -> set[str]:
    """Every command line of the README's shell blocks, its comment dropped."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```sh\n(.*?)```", text, flags=re.S)
    return {line.split("#")[0].strip() for block in blocks for line in block.splitlines() if line.strip()}


def test_a_single_gpu_and_a_multi_gpu_job_on_self_hosted_gpu_runners_for_both_implementations():
    jobs = _jobs()
    assert {"single-gpu", "multi-gpu"} <= set(jobs), f"jobs of {WORKFLOW.name}: {sorted(jobs)}"
    for name in ("single-gpu", "multi-gpu"):
        job = jobs[name]
        assert {"self-hosted", "gpu"} <= set(job["runs-on"]), f"{name} runs on {job['runs-on']}"
        impls = {c["impl"] for c in _combinations(job)}
        assert impls == IMPLS, f"{name} tests {sorted(impls)}, not both implementations"


def test_every_command_of_the_workflow_is_one_the_readme_gives():
    readme = _readme_commands()
    for name, job in _jobs().items():
        for combination in _combinations(job):
            for step in job["steps"]:
                if "run" not in step:
                    continue
                for line in step["run"].strip().splitlines():
                    command = _expanded(line, combination).strip()
                    assert command in readme, f"{name} ({combination}) runs {command!r}, which the README does not give"


def test_the_single_gpu_job_pins_one_rank_and_the_multi_gpu_job_takes_every_gpu():
    jobs = _jobs()
    single = " ".join(step.get("run", "") for step in jobs["single-gpu"]["steps"])
    multi = " ".join(step.get("run", "") for step in jobs["multi-gpu"]["steps"])
    assert "make conformance-native" in single and "NPROC=1" in single, single
    assert "make conformance-native" in multi and "NPROC=" not in multi, multi


def test_the_reports_the_make_target_writes_are_kept_as_artifacts():
    for name, job in _jobs().items():
        uploads = [step for step in job["steps"] if str(step.get("uses", "")).startswith("actions/upload-artifact")]
        assert uploads, f"{name} keeps no artifact"
        assert all(step.get("if") == "always()" for step in uploads), f"{name}: reports must be kept when the run fails"
        for combination in _combinations(job):
            paths = {_expanded(p, combination).strip() for step in uploads for p in step["with"]["path"].splitlines() if p.strip()}
            expected = {f"reports/conformance-{combination['impl']}-native.{suffix}" for suffix in REPORT_SUFFIXES}
            assert expected <= paths, f"{name} ({combination}) keeps {sorted(paths)}, not {sorted(expected - paths)}"


def test_make_conformance_native_is_torchrun_of_the_native_backend_writing_those_reports():
    done = subprocess.run(["make", "-n", "conformance-native", "IMPL=accelerate", "NPROC=3"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    recipe = done.stdout.replace("\\\n", " ")
    assert re.search(r"-m torch\.distributed\.run --nproc_per_node 3 --master_port \d+", recipe), recipe
    assert "-m conformance run --backend native --impl accelerate" in recipe, recipe
    for suffix in REPORT_SUFFIXES:
        assert f"reports/conformance-accelerate-native.{suffix}" in recipe, recipe
