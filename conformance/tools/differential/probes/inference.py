"""Probes of ``accelerate.inference``: ``prepare_pippy`` (pipeline-parallel inference) at 1 and 2 ranks.

At 2 ranks a small seeded model is split in two stages; what each rank holds and returns is compared exactly.
"""

from __future__ import annotations

import torch
from torch import nn

from ..probe import Api, probe


def _tiny_model() -> nn.Module:
    """About 2.5 KB of weights: HF's automatic split cannot size a model under 1 KB ("bytes" is no unit to it)."""
    return nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 48)).eval()


@probe("inference")
def prepare_pippy_on_one_process(api: Api) -> None:
    api.partial_state()
    model = _tiny_model()
    prepared = api.call("prepare", "inference.prepare_pippy", model, example_args=(torch.ones(1, 4),))
    api.observe("the model itself", lambda: prepared is model)
    api.observe("split points", getattr, model, "hf_split_points")


@probe("inference", worlds=(2,), timeout=120)
def prepare_pippy(api: Api) -> None:
    api.partial_state()
    batch = torch.arange(8.0).view(2, 4)
    for label, options in {"split at '2'": {"split_points": ["2"]},
                           "auto, gathered": {"gather_output": True}}.items():
        model = _tiny_model()
        prepared = api.call(f"{label}: prepare", "inference.prepare_pippy", model, example_args=(batch[:1],),
                            **options)
        if prepared is None:
            continue
        api.observe(f"{label}: split points", getattr, prepared, "hf_split_points")
        stage = getattr(prepared.pippy_stage, "_stage", None)
        api.observe(f"{label}: parameters held", lambda: sorted(name for name, _ in stage.submod.named_parameters()))
        with torch.no_grad():
            api.observe(f"{label}: output", prepared, batch)
