"""Tiny models and helpers shared by the big-model cases (sizes in bytes are small, budgets in KB or MB).

Not a case module (its name does not start with ``test_``).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch
from torch import nn

from ..engine.case import NotSupported


class Probe(nn.Linear):
    """A Linear that records, at each forward, the device of its weight and of its input (``seen``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen = (str(self.weight.device), str(x.device))
        return super().forward(x)


class Block(nn.Module):
    """Two Linears, a float buffer and an integer buffer: the unit ``no_split_module_classes`` keeps whole."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.a = Probe(width, width)
        self.b = Probe(width, width)
        self.register_buffer("shift", torch.full((width,), 0.5))
        self.register_buffer("count", torch.zeros(width, dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x))) + self.shift


class Net(nn.Module):
    """Embedding, ``depth`` blocks and a head (optionally tied to the embedding)."""

    def __init__(self, width: int = 16, depth: int = 4, tie: bool = False, vocab: int = 10) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = Probe(width, vocab, bias=False)
        if tie:
            self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(ids)
        for block in self.blocks:
            hidden = block(hidden)
        return self.head(hidden)


def built(seed: int = 0, **kwargs: Any) -> Net:
    torch.manual_seed(seed)
    return Net(**kwargs).eval()


def tensor_bytes(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> int:
    """Bytes of ``tensor`` counted by hand (``dtype`` applies to floating tensors)."""
    use = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
    return tensor.numel() * torch.empty((), dtype=use).element_size()


def hand_sizes(model: nn.Module, dtype: torch.dtype | None = None) -> dict[str, int]:
    """Per-module byte counts (parameters and buffers, tied weights once) computed without the implementation."""
    sizes: dict[str, int] = {}
    seen: set[int] = set()
    named = list(model.named_parameters()) + list(model.named_buffers())
    for name, tensor in named:
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        parts = name.split(".")
        for end in range(len(parts) + 1):
            key = ".".join(parts[:end])
            sizes[key] = sizes.get(key, 0) + tensor_bytes(tensor, dtype)
    return sizes


def owner_of(name: str, device_map: dict) -> Any:
    """The device ``device_map`` gives weight or module ``name`` (longest matching key)."""
    keys = [k for k in device_map if k == "" or name == k or name.startswith(k + ".")]
    return device_map[max(keys, key=len)] if keys else None


def npu_devices(needed: int) -> list[str]:
    """``["npu:0", ...]`` when ``needed`` mock (or real) NPUs are here, else NOT_SUPPORTED."""
    if importlib.util.find_spec("torch_npu") is None:
        raise NotSupported("no npu device here: torch_npu is not installed")
    import torch_npu  # noqa: F401  (registers torch.npu)

    count = torch.npu.device_count()
    if count < needed:
        raise NotSupported(f"{needed} npu devices needed, {count} present")
    return [f"npu:{index}" for index in range(needed)]


#: The environment of the several-accelerator cases: four mock NPUs of 64 MB each.
FOUR_NPUS = {"SIMULATORS_NPU_DEVICE_COUNT": "4", "SIMULATORS_DEVICE_MEMORY": "64MB"}
