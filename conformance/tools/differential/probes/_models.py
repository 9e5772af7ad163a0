"""Small models and views of their weights, shared by the big-model probes (utils.modeling, hooks, big_modeling).

Not a probe module (no probes register here): the models are fixed and
tiny, so every probe's observations are exact values.
"""

from __future__ import annotations

import contextlib
import io
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

#: The environment of the probes on two mock CUDA GPUs of 4 MB each, small enough that a device map spills to the
#: CPU and the disk; with no cuBLAS workspace (``CUBLAS_WORKSPACE_CONFIG=:0:0``, as cuBLAS documents it), which a
#: 4 MB GPU could not hold (a Hopper's is 32 MiB).
TWO_GPUS = {"SIMULATORS_CUDA_DEVICE_COUNT": "2", "SIMULATORS_DEVICE_MEMORY": "4MB", "CUBLAS_WORKSPACE_CONFIG": ":0:0"}


class Block(nn.Module):
    """A layer the probes keep whole (``no_split_module_classes=["Block"]``): a linear and a batch norm."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.norm = nn.BatchNorm1d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.linear(x))


class Net(nn.Module):
    """embed (64 bytes), two Blocks (152 each), head (40), a buffer of the model itself and a non-persistent one."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(3, 4)
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(4, 2)
        self.register_buffer("scale", torch.full((2,), 2.0))
        self.register_buffer("cache", torch.zeros(3), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(x))) * self.scale


class Tied(nn.Module):
    """An embedding whose weight the output layer shares, with a body in between."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(5, 4)
        self.body = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        self.head = nn.Linear(4, 5, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(ids)))


class PreTrainedModel(nn.Module):
    """Looks like a 🤗 Transformers model to accelerate (a class named PreTrainedModel, a config asking for ties)."""

    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(tie_word_embeddings=True)
        self.embed = nn.Embedding(5, 4)
        self.lm_head = nn.Linear(4, 5, bias=False)

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.embed(ids))


def net_input() -> torch.Tensor:
    return torch.arange(6.0).reshape(2, 3) / 6


def placement(model: nn.Module) -> dict[str, Any]:
    """Every parameter and buffer (tied names too): device, dtype, Parameter or not, requires_grad."""
    seen = {}
    for name, tensor in list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False)):
        seen[name] = [str(tensor.device), str(tensor.dtype), type(tensor).__name__, tensor.requires_grad]
    return seen


def hooks_of(model: nn.Module) -> dict[str, Any]:
    """The hook of every module that has one: its class and, for AlignDevicesHook, its repr; nested hooks listed."""
    found = {}
    for name, module in model.named_modules():
        hook = getattr(module, "_hf_hook", None)
        if hook is not None:
            found[name] = describe_hook(hook)
    return found


def describe_hook(hook: Any) -> Any:
    inner = getattr(hook, "hooks", None)
    if inner is not None:
        return [type(hook).__name__, [describe_hook(h) for h in inner]]
    return repr(hook) if type(hook).__name__ == "AlignDevicesHook" else type(hook).__name__


def quiet(function, *args, **kwargs):
    """``function``'s value with whether it drew a progress bar on stderr (the bar's timings vary run to run)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        value = function(*args, **kwargs)
    return {"value": value, "progress bar": bool(err.getvalue())}
