"""The documentation: docs/ builds with warnings as errors, the README stays a front door, and every command the
README gives is run by a test or says why not.

The README's runnable blocks (:mod:`tests.readme`) run here, from the repository root with the interpreter's scripts
first on PATH; each command must exit 0 (its output as shown is not compared: sizes and times vary). The commands
of its other blocks are run by the tests :data:`RUN_ELSEWHERE` names, or are :data:`NOT_RUN` with the reason.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import readme

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
README = readme.README
DOCS = ROOT / "docs"
#: README commands outside its runnable blocks, each with the test that runs it as written.
RUN_ELSEWHERE: dict[str, str] = {
    "pip install .": "tests/test_packaging.py::test_the_readmes_install_commands_make_an_environment_that_lists_the_suite_and_dry_runs",
    'pip install ".[hf,transformers,finetune]"':
        "tests/test_packaging.py::test_the_readmes_install_commands_make_an_environment_that_lists_the_suite_and_dry_runs",
    "make conformance": "tests/test_docs.py::test_make_conformance_runs_as_the_readme_gives_it",
}
#: README commands no test runs, matched by prefix, each with why.
NOT_RUN: dict[str, str] = {
    "make conformance-native": "needs GPUs, and PyPI's CUDA build of torch (TORCH_SPEC=torch) from the network",
    "make test": "it is what runs these tests (CI's .ci/run calls it, see test_ci_runs_the_readmes_test_command)",
}
# Phrases that user-facing text never uses: issue numbers, sessions.
INTERNAL = re.compile(r"issue [0-9]+|this session", re.IGNORECASE)


def not_run_because(command: str) -> str | None:
    return next((why for prefix, why in NOT_RUN.items() if command.startswith(prefix)), None)


def test_docs_build_without_warnings():
    """``make docs``'s build, into the folder it uses (``make test`` builds the site once, here; CI keeps it)."""
    pytest.importorskip("sphinx", reason="sphinx is not installed (extra `docs`: pip install -e '.[docs]')")
    pytest.importorskip("myst_parser", reason="myst-parser is not installed (extra `docs`)")
    pytest.importorskip("sphinxarg", reason="sphinx-argparse is not installed (extra `docs`)")
    pytest.importorskip("furo", reason="furo is not installed (extra `docs`)")
    out = DOCS / "_build" / "html"
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for page in ("index", "tutorials/fit-check", "how-to/gpu-runner", "how-to/vendors", "concepts/catalog",
                 "reference/cli", "reference/api", "reference/changelog"):
        assert (out / f"{page}.html").is_file(), page
    cli = (out / "reference/cli.html").read_text(encoding="utf-8")
    assert "--simulate" in cli and "--case-timeout" in cli, "the CLI reference lacks options of the parsers"
    catalog = (out / "concepts/catalog.html").read_text(encoding="utf-8")
    assert "state.attributes" in catalog, "the catalog page does not render conformance/catalog.md"


def test_no_internal_references():
    found = []
    for path in [README, *sorted(p for p in DOCS.rglob("*") if p.is_file() and "_build" not in p.parts)]:
        if path.suffix not in {".md", ".py", ".rst", ".txt"}:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if INTERNAL.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_readme_is_a_front_door():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move detail into docs/"
    for link in re.findall(r"\]\(((?:docs|conformance)/[^)#]+)\)", "\n".join(lines)):
        assert (ROOT / link).exists(), f"README links to a missing file: {link}"


def test_readme_has_runnable_commands():
    assert len(readme.runnable_commands()) >= 3, readme.commands()


def test_every_readme_command_is_run_by_a_test_or_says_why_not():
    unaccounted = [command for command, runnable in readme.commands()
                   if not runnable and command not in RUN_ELSEWHERE and not_run_because(command) is None]
    assert unaccounted == [], "README commands that no test runs: add them to a runnable block, RUN_ELSEWHERE or NOT_RUN"
    for command, test in RUN_ELSEWHERE.items():
        path, name = test.split("::")
        assert f"def {name}(" in (ROOT / path).read_text(encoding="utf-8"), f"{command!r}: {test} does not exist"
    guarded = [command for command in readme.runnable_commands() if not_run_because(command)]
    assert guarded == [], f"commands in runnable blocks that cannot run here: {guarded}"


def test_ci_runs_the_readmes_test_command():
    assert ("make test", False) in readme.commands()
    assert "\nmake test\n" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


@pytest.mark.parametrize("command", readme.runnable_commands())
def test_readme_command_runs(command):
    scripts = str(Path(sys.executable).parent)
    if shutil.which("accelerate-ref", path=scripts) is None and "accelerate-ref" in command:
        pytest.skip("the accelerate-ref console script is not installed beside this interpreter")
    env = {**os.environ, "PATH": scripts + os.pathsep + os.environ.get("PATH", "")}
    done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"$ {command}\nexit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"


def test_make_conformance_runs_as_the_readme_gives_it(tmp_path):
    """The README's ``make conformance`` on every backend it runs, narrowed to one case at worlds 1 and 2 (the whole
    suite at every world is tests/conformance/test_full.py's): each backend's reports, the matrix and the statement."""
    if not (ROOT / ".venv" / ".installed").exists():
        pytest.skip("the Makefile's .venv is not set up here (`make test` sets it up)")
    command = "make conformance"
    assert (command, False) in readme.commands()
    # PREBUILD=: the one case needs none of DeepSpeed's ops, which a fresh environment would spend minutes building.
    done = subprocess.run([*command.split(), "CASES=gather.first_dim", "WORLDS=1,2", f"REPORTS={tmp_path}", "PREBUILD="], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    backends = ("sim", "sim-xla", "sim-npu")
    written = sorted(path.name for path in tmp_path.iterdir())
    expected = sorted([*(f"conformance-accelerate_ref-{b}.{kind}" for b in backends for kind in ("json", "xml")),
                       "conformance-accelerate_ref.md", "conformance-accelerate_ref.html",
                       "statement-accelerate_ref-hf-1.15.md", "statement-accelerate_ref-hf-1.15.json"])
    assert written == expected
    assert done.stdout.count("2 pass in") == len(backends), done.stdout[-4000:]
