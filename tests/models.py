"""Helpers shared by test modules that run accelerate_ref and HF accelerate side by side."""

from __future__ import annotations

import torch


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2)
