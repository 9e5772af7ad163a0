"""Probes of ``accelerate.utils.operations``: results, refusals and their messages, at 1 and 2 ranks."""

from __future__ import annotations

import torch

from ..probe import Api, probe


@probe("utils.operations", worlds=(1, 2))
def gather(api: Api) -> None:
    api.partial_state()
    api.call("a tensor", "utils.operations.gather", torch.arange(3.0) + api.rank)
    api.call("a nested structure", "utils.operations.gather", {"a": torch.tensor([api.rank]), "b": [torch.ones(2)]})
    api.call("a 0-d tensor", "utils.operations.gather", torch.tensor(float(api.rank)))
    api.call("not a tensor", "utils.operations.gather", "text")


@probe("utils.operations", worlds=(1, 2))
def reduce(api: Api) -> None:
    api.partial_state()
    for reduction in ("mean", "sum", "max", "min"):
        api.call(f"reduction {reduction}", "utils.operations.reduce", torch.tensor([1.0, 3.0]) * (api.rank + 1),
                 reduction)
    api.call("scale", "utils.operations.reduce", torch.tensor([2.0]), "sum", 0.5)
