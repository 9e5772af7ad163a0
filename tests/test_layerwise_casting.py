"""Layerwise casting: weights stored low, upcast per forward, as HF 1.15's `attach_layerwise_casting_hooks`.

Compared with HF's function on the same model: which layers are hooked,
their stored dtypes, and the outputs of the forward.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from accelerate_ref.big_modeling import attach_layerwise_casting_hooks
from accelerate_ref.hooks import LayerwiseCastingHook

hf_big_modeling = pytest.importorskip("accelerate.big_modeling")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.proj(x)))


def _pair() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    ours = Block()
    theirs = Block()
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def _dtypes(model: nn.Module) -> dict[str, torch.dtype]:
    return {name: p.dtype for name, p in model.named_parameters()}


@pytest.mark.parametrize(
    "options",
    [{}, {"skip_modules_pattern": ("head\\.2",)}, {"skip_modules_classes": (nn.Sequential,)}],
    ids=["every-layer", "skip-by-name", "skip-by-class"],
)
@pytest.mark.parametrize("storage", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "fp8"])
def test_layers_are_stored_low_and_run_high_as_hf(options, storage):
    ours, theirs = _pair()
    attach_layerwise_casting_hooks(ours, storage_dtype=storage, compute_dtype=torch.float32, **options)
    hf_big_modeling.attach_layerwise_casting_hooks(theirs, storage_dtype=storage, compute_dtype=torch.float32, **options)
    assert _dtypes(ours) == _dtypes(theirs)
    assert storage in _dtypes(ours).values(), "no weight is stored in the storage dtype"
    assert _dtypes(ours)["norm.weight"] == torch.float32, "LayerNorm is not an upcastable layer"
    x = torch.randn(3, 8)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=0)
    assert _dtypes(ours) == _dtypes(theirs), "after the forward the weights go back to the storage dtype"


def test_the_hook_appends_to_a_hook_already_there():
    layer = nn.Linear(4, 4)
    attach_layerwise_casting_hooks(layer, storage_dtype=torch.bfloat16, compute_dtype=torch.float32)
    attach_layerwise_casting_hooks(layer, storage_dtype=torch.float16, compute_dtype=torch.float32)
    hooks = getattr(layer._hf_hook, "hooks", ())
    assert [type(h) for h in hooks] == [LayerwiseCastingHook, LayerwiseCastingHook]
    assert layer.weight.dtype == torch.float16
