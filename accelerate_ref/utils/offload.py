"""Weights offloaded to disk: one memory-mapped ``<name>.dat`` file per tensor and an ``index.json``.

The index maps each weight name to ``{"dtype": numpy dtype name or
"bfloat16", "shape": [...]}``; an entry may instead point into a
safetensors file (``{"safetensors_file": path, "weight_name": key,
"dtype": ...}``). bfloat16 (which numpy lacks) is stored as int16 bits.

Catalog: modeling.offload_roundtrip, modeling.load_checkpoint_device_map.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any, Iterator, Optional, Union

import numpy as np
import torch

INDEX_NAME = "index.json"


def offload_weight(
    weight: torch.Tensor, weight_name: str, offload_folder: Union[str, os.PathLike], index: Optional[dict] = None
) -> Optional[dict]:
    """Write ``weight`` to ``<offload_folder>/<weight_name>.dat`` (numpy memmap) and record it in ``index``.

    Catalog: modeling.offload_roundtrip.
    """
    dtype_name = None
    if weight.dtype == torch.bfloat16:
        weight, dtype_name = weight.view(torch.int16), "bfloat16"
    array = weight.detach().cpu().numpy()
    if index is not None:
        index[weight_name] = {"dtype": dtype_name or str(array.dtype), "shape": list(array.shape)}
    if array.ndim == 0:
        array = array[None]
    path = os.path.join(os.fspath(offload_folder), f"{weight_name}.dat")
    mapped = np.memmap(path, dtype=array.dtype, mode="w+", shape=array.shape)
    mapped[:] = array[:]
    mapped.flush()
    del mapped
    return index


def load_offloaded_weight(weight_file: Union[str, os.PathLike], weight_info: dict[str, Any]) -> torch.Tensor:
    """The tensor stored in ``weight_file`` as described by its index entry ``weight_info``.

    Catalog: modeling.offload_roundtrip.
    """
    shape = tuple(weight_info["shape"])
    stored = "int16" if weight_info["dtype"] == "bfloat16" else weight_info["dtype"]
    mapped = np.memmap(weight_file, dtype=stored, mode="r", shape=shape or (1,))
    tensor = torch.from_numpy(np.array(mapped[0] if not shape else mapped))
    return tensor.view(torch.bfloat16) if weight_info["dtype"] == "bfloat16" else tensor


def save_offload_index(index: dict, offload_folder: Union[str, os.PathLike]) -> None:
    """Merge ``index`` into ``<offload_folder>/index.json`` (written whole, then renamed into place)."""
    if not index:
        return
    path = os.path.join(os.fspath(offload_folder), INDEX_NAME)
    merged: dict = {}
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as stream:
            merged = json.load(stream)
    merged.update(index)
    partial = path + ".partial"
    with open(partial, "w", encoding="utf-8") as stream:
        json.dump(merged, stream, indent=2)
    os.replace(partial, path)


def offload_state_dict(save_dir: Union[str, os.PathLike], state_dict: dict[str, torch.Tensor]) -> None:
    """Write every tensor of ``state_dict`` to ``save_dir`` (one ``.dat`` each) and its ``index.json``.

    Catalog: modeling.offload_roundtrip.
    """
    os.makedirs(save_dir, exist_ok=True)
    index: dict = {}
    for name, tensor in state_dict.items():
        offload_weight(tensor, name, save_dir, index=index)
    save_offload_index(index, save_dir)


class PrefixedDataset(Mapping):
    """The entries of ``dataset`` whose keys start with ``prefix``, addressed without it."""

    def __init__(self, dataset: Mapping, prefix: str) -> None:
        self.dataset = dataset
        self.prefix = prefix

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.dataset[f"{self.prefix}{key}"]

    def __iter__(self) -> Iterator[str]:
        return iter([key for key in self.dataset if key.startswith(self.prefix)])

    def __len__(self) -> int:
        return len(self.dataset)


class OffloadedWeightsLoader(Mapping):
    """A read-only mapping of weight names to tensors, read from disk on each access.

    It holds ``state_dict`` (tensors kept in memory) plus the weights of
    ``index`` (default: ``<save_folder>/index.json``) read from their
    ``.dat`` files or safetensors files only when asked for, on ``device``
    for safetensors entries. Catalog: modeling.offload_roundtrip.
    """

    def __init__(
        self,
        state_dict: Optional[dict[str, torch.Tensor]] = None,
        save_folder: Optional[Union[str, os.PathLike]] = None,
        index: Optional[dict] = None,
        device: Optional[Union[int, str, torch.device]] = None,
    ) -> None:
        if state_dict is None and save_folder is None and index is None:
            raise ValueError("OffloadedWeightsLoader needs a state_dict, a save_folder or an index")
        self.state_dict = state_dict or {}
        self.save_folder = save_folder
        if index is None and save_folder is not None:
            with open(os.path.join(os.fspath(save_folder), INDEX_NAME), encoding="utf-8") as stream:
                index = json.load(stream)
        self.index = index or {}
        self.all_keys = list(self.state_dict) + [key for key in self.index if key not in self.state_dict]
        self.device = device

    def __getitem__(self, key: str) -> torch.Tensor:
        if key in self.state_dict:
            return self.state_dict[key]
        info = self.index[key]
        if "safetensors_file" in info:
            from safetensors import safe_open

            from ._modeling.sizes import as_torch_device

            device = "cpu" if self.device is None else as_torch_device(self.device)
            with safe_open(info["safetensors_file"], framework="pt", device=str(device)) as handle:
                tensor = handle.get_tensor(info.get("weight_name", key))
            if "dtype" in info:
                tensor = tensor.to(getattr(torch, info["dtype"]))
            return tensor
        return load_offloaded_weight(os.path.join(os.fspath(self.save_folder), f"{key}.dat"), info)

    def __iter__(self) -> Iterator[str]:
        return iter(self.all_keys)

    def __len__(self) -> int:
        return len(self.all_keys)


def extract_submodules_state_dict(state_dict: dict[str, torch.Tensor], submodule_names: list[str]) -> dict[str, torch.Tensor]:
    """The entries of ``state_dict`` that belong to one of ``submodule_names`` (the name itself or below it)."""
    result: dict[str, torch.Tensor] = {}
    for module_name in submodule_names:
        result.update({k: v for k, v in state_dict.items() if k == module_name or k.startswith(module_name + ".")})
    return result
