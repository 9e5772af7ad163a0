"""Command-line plumbing shared by ``python -m simulators`` and ``python -m conformance``.

Rule: every usage error is one line on stderr, ``PROG: error: MESSAGE``,
and exit status 2 (argparse's default also prints the usage first).
"""
from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and exit status 2 (its sub-parsers too)."""

    def error(self, message: str) -> NoReturn:
        first_line = " ".join(message.split())
        sys.stderr.write(f"{self.prog}: error: {first_line}\n")
        sys.exit(2)
