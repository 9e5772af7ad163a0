"""`accelerate_ref.utils.ao`: FP8 through torchao (the real package, extra ``ao``) side by side with HF 1.15:
which layers are converted, and the refusal without torchao.

Catalog: plugin.unavailable_engines.
"""

from __future__ import annotations

import accelerate.utils.ao as hf_ao  # noqa: E402
import pytest
import torch
from torch import nn

from accelerate_ref.utils import ao as ref_ao  # noqa: E402
from accelerate_ref.utils import imports as ref_imports  # noqa: E402
from tests.optional import needs_torchao


class Mixed(nn.Module):
    """Linear layers of which some have a dimension that is no multiple of 16."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(32, 64)
        self.odd = nn.Linear(64, 40)
        self.inner = nn.Sequential(nn.Linear(40, 64), nn.ReLU(), nn.Linear(64, 64))
        self.last = nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(self.inner(self.odd(self.first(x))))


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
def test_layer_filters_as_hf():
    model = Mixed()
    assert ref_ao.find_first_last_linear_layers(model) == hf_ao.find_first_last_linear_layers(model) == ("first", "last")
    assert ref_ao.find_first_last_linear_layers(nn.ReLU()) == hf_ao.find_first_last_linear_layers(nn.ReLU())
    for filter_out in ([], ["first", "last"], ["inner.2"]):
        for fqn, module in model.named_modules():
            ref = ref_ao.filter_linear_layers(module, fqn, layers_to_filter=filter_out)
            assert ref is hf_ao.filter_linear_layers(module, fqn, layers_to_filter=filter_out), (fqn, filter_out)
    for fqn, module in model.named_modules():
        ref = ref_ao.filter_first_and_last_linear_layers(module, fqn)
        assert ref is hf_ao.filter_first_and_last_linear_layers(module, fqn), fqn


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
def test_ao_conversion_refused_without_torchao(monkeypatch):
    monkeypatch.setattr(ref_imports, "is_torchao_available", lambda: False)
    for function in (ref_ao.convert_model_to_fp8_ao, ref_ao.has_ao_layers):
        with pytest.raises(ImportError, match="torchao"):
            function(Mixed())


def _converted(convert, **kwargs) -> nn.Module:
    torch.manual_seed(0)
    model = Mixed()
    convert(model, **kwargs)
    return model


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
@needs_torchao
@pytest.mark.parametrize("filter_name", [None, "first_and_last", "everything"])
def test_ao_conversion_as_hf(filter_name):
    """The same layers become torchao Float8Linear, and ours computes exactly what HF's does, forward and backward."""
    from torchao.float8 import Float8LinearConfig
    from torchao.float8.float8_linear import Float8Linear

    filters = {None: None, "first_and_last": ref_ao.filter_first_and_last_linear_layers, "everything": lambda m, fqn: True}
    kwargs = {"config": Float8LinearConfig(), "module_filter_func": filters[filter_name]}
    ref, hf = _converted(ref_ao.convert_model_to_fp8_ao, **kwargs), _converted(hf_ao.convert_model_to_fp8_ao, **kwargs)
    fp8 = [name for name, module in ref.named_modules() if isinstance(module, Float8Linear)]
    assert fp8 == [name for name, module in hf.named_modules() if isinstance(module, Float8Linear)]
    assert fp8 and ref_ao.has_ao_layers(ref) and hf_ao.has_ao_layers(ref)
    assert not ref_ao.has_ao_layers(Mixed())
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(1))
    ref_out, hf_out = ref(x), hf(x)
    assert torch.equal(ref_out, hf_out)
    ref_out.square().mean().backward()
    hf_out.square().mean().backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(ref.parameters(), hf.parameters()))
    if filter_name is None:  # the default leaves the first, the last and the Linear layers sized 40 alone
        assert fp8 == ["inner.2"]
