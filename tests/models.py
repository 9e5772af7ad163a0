"""Small models the project's tests share (the suite's cases have theirs in `conformance.support.models`)."""

from __future__ import annotations

import torch


def seeded_linear() -> torch.nn.Module:
    """A ``Linear(3, 2)`` with the same weights at every call (seed 0)."""
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2)
