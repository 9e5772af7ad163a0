"""FP8 training through torchao: which ``nn.Linear`` layers to convert, and the conversion.

The layer filters are plain torch; `convert_model_to_fp8_ao` and
`has_ao_layers` need the `torchao` package (extra ``ao``; an ImportError
without it). torchao's ``Float8Linear`` runs on CPU too (torch's
``_scaled_mm`` has a CPU kernel), so the conversion is tested here for real.
Catalog: plugin.unavailable_engines.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Callable, Optional

import torch

from .imports import torchao_required

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchao.float8 import Float8LinearConfig

#: FP8 matrix multiplications need both dimensions of a converted Linear divisible by this.
FP8_DIMENSION_MULTIPLE = 16


def find_first_last_linear_layers(model: torch.nn.Module) -> tuple[Optional[str], Optional[str]]:
    """The qualified names of the first and last ``nn.Linear`` in ``model.named_modules()`` order (None if none).

    FP8 training keeps them in higher precision for stability. Catalog: plugin.unavailable_engines.
    """
    names = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    return (names[0], names[-1]) if names else (None, None)


def filter_linear_layers(module: torch.nn.Module, fqn: str, layers_to_filter: list[str]) -> bool:
    """Whether to convert ``module`` (named ``fqn``) to FP8.

    Rule (HF's): False for an ``nn.Linear`` whose ``in_features`` or
    ``out_features`` is not a multiple of 16, and for a name in
    ``layers_to_filter``; True otherwise (also for modules that are not
    Linear: torchao only asks about Linear layers). Catalog: plugin.unavailable_engines.
    """
    if isinstance(module, torch.nn.Linear) and (
        module.in_features % FP8_DIMENSION_MULTIPLE or module.out_features % FP8_DIMENSION_MULTIPLE
    ):
        return False
    return fqn not in layers_to_filter


def filter_first_and_last_linear_layers(module: torch.nn.Module, fqn: str) -> bool:
    """`filter_linear_layers` with ``layers_to_filter`` the first and last Linear found *inside* ``module``.

    As in HF, the first/last layers are looked up in the module being asked
    about, not in the whole model. Catalog: plugin.unavailable_engines.
    """
    return filter_linear_layers(module, fqn, layers_to_filter=list(find_first_last_linear_layers(module)))


@torchao_required
def has_ao_layers(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds a torchao ``Float8Linear``. Catalog: plugin.unavailable_engines."""
    from torchao.float8.float8_linear import Float8Linear

    return any(isinstance(module, Float8Linear) for module in model.modules())


@torchao_required
def convert_model_to_fp8_ao(
    model: torch.nn.Module,
    config: Optional["Float8LinearConfig"] = None,
    module_filter_func: Optional[Callable] = None,
) -> None:
    """Swap ``model``'s ``nn.Linear`` layers for torchao ``Float8Linear`` in place (torchao's ``convert_to_float8_training``).

    Rule: ``module_filter_func(module, fqn)`` picks the layers; by default
    `filter_linear_layers` leaving out the model's first and last Linear.
    ``config`` is a torchao ``Float8LinearConfig`` (None: torchao's default).
    Catalog: plugin.unavailable_engines.
    """
    from torchao.float8 import convert_to_float8_training

    if module_filter_func is None:
        module_filter_func = partial(filter_linear_layers, layers_to_filter=list(find_first_last_linear_layers(model)))
    convert_to_float8_training(model, module_filter_fn=module_filter_func, config=config)
