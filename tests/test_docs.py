"""The documentation: docs/ builds with warnings as errors, the README stays a front door, and the README's
runnable commands run.

A fenced ``sh`` block of the README preceded by the line ``<!-- runnable -->`` is runnable: each of its lines
that starts with ``$ `` is a command, run from the repository root with the interpreter's scripts first on
PATH, which must exit 0; the other lines are its output as shown (not compared: sizes and times vary).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MARK = "<!-- runnable -->"
# Commands never run here even in a runnable block, matched by prefix, each with why (the README keeps
# such commands in blocks that are not marked runnable; this list guards against one moving into one).
SKIPPED: dict[str, str] = {
    "make conformance-native": "needs GPUs",
    "pip install": "needs the network",
}
# Phrases that user-facing text never uses: issue numbers, sessions.
INTERNAL = re.compile(r"issue [0-9]+|this session", re.IGNORECASE)


def runnable_commands(text: str) -> list[str]:
    """The ``$ `` lines of the fenced ``sh`` blocks that follow a ``<!-- runnable -->`` line."""
    commands, lines, index = [], text.splitlines(), 0
    while index < len(lines):
        if lines[index].strip() == MARK and index + 1 < len(lines) and lines[index + 1].strip() == "```sh":
            index += 2
            while index < len(lines) and lines[index].strip() != "```":
                if lines[index].startswith("$ "):
                    commands.append(lines[index][2:].strip())
                index += 1
        index += 1
    return commands


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
    commands = runnable_commands(README.read_text(encoding="utf-8"))
    assert len(commands) >= 3, commands


@pytest.mark.parametrize("command", runnable_commands(README.read_text(encoding="utf-8")))
def test_readme_command_runs(command):
    for prefix, why in SKIPPED.items():
        if command.startswith(prefix):
            pytest.skip(why)
    scripts = str(Path(sys.executable).parent)
    if shutil.which("accelerate-ref", path=scripts) is None and "accelerate-ref" in command:
        pytest.skip("the accelerate-ref console script is not installed beside this interpreter")
    env = {**os.environ, "PATH": scripts + os.pathsep + os.environ.get("PATH", "")}
    done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"$ {command}\nexit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
