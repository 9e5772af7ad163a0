"""The README's commands, as its fenced ``sh`` blocks give them.

A block preceded by the line ``<!-- runnable -->`` is runnable: each of its lines that starts with ``$ `` is a
command, and the other lines are its output as shown. In other blocks every line is a command (a trailing
``# comment`` is not part of it).
"""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
MARK = "<!-- runnable -->"


def commands(text: str | None = None) -> list[tuple[str, bool]]:
    """Every command of the README (or of ``text``) in order, each with whether its block is runnable."""
    lines = (README.read_text(encoding="utf-8") if text is None else text).splitlines()
    found, index = [], 0
    while index < len(lines):
        if lines[index].strip() == "```sh":
            runnable = index > 0 and lines[index - 1].strip() == MARK
            index += 1
            while index < len(lines) and lines[index].strip() != "```":
                line = lines[index]
                if runnable and line.startswith("$ "):
                    found.append((line[2:].strip(), True))
                elif not runnable and line.split("#", 1)[0].strip():
                    found.append((line.split("#", 1)[0].strip(), False))
                index += 1
        index += 1
    return found


def runnable_commands(text: str | None = None) -> list[str]:
    """The ``$ `` lines of the runnable blocks."""
    return [command for command, runnable in commands(text) if runnable]
