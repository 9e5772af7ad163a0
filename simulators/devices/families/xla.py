"""The mock XLA device (TPU-shaped worlds): ``xla`` tensors, the XLA RNG and the step graphs.

The stand-in ``torch_xla`` package (``sites/xla/torch_xla``, following
torch-xla 2.9's API) is what implementations import; importing it calls
:func:`install`, and its modules keep their state here. A world gets it by
putting ``sites/xla`` first on every rank's import path
(:func:`simulators.devices.world_settings`), so that HF accelerate, which
imports ``torch_xla`` at module import time when it can find it, sees XLA.

Rules (catalog ``xla.distributed_type``, ``xla.collectives``,
``xla.static_shapes``):

- rank ``r`` of the world is XLA replica ``r``; its device is
  ``xla:<local rank>`` (as torch-xla's ``torch_xla.launch`` numbers the
  devices of a host: ``xla:0``..``xla:3`` on 4 devices);
- an `XlaTensor` reports ``device.type == "xla"`` (``is_xla`` too) and follows
  :mod:`simulators.devices.families.tensor` (mixing with CPU tensors raises); every op
  on one joins the current step's graph (:data:`GRAPHS`);
- ``torch.autocast("xla", dtype)`` casts as torch's autocast does
  (:mod:`simulators.devices.kernels.autocast`);
- random ops on XLA tensors draw from the XLA RNG, whose state is one
  integer seed (``xm.get_rng_state``/``xm.set_rng_state``; default 101, as
  torch-xla's), advanced by every random op; ``torch.manual_seed`` leaves it
  alone.
"""
from __future__ import annotations

import os
import torch

from simulators.devices.families import backend, machine
from simulators.devices.memory.books import DeviceMemory
from simulators.devices.families.replicas import replicas
from simulators.devices.families.steps import StepGraphs
from simulators.devices.families.tensor import DeviceTensor

#: The version the stand-in reports (the torch-xla release whose API it follows).
VERSION = "2.9.0+sim"
#: PrivateUse1's name in XLA worlds: the C++ side of an `XlaTensor` (users see ``xla``).
HIDDEN_NAME = "xla_sim"
#: The XLA RNG's seed before anything sets it.
DEFAULT_SEED = 101

#: The step graphs of this process's XLA replica.
GRAPHS = StepGraphs()


class XlaRng:
    """XLA's RNG state: one integer seed, advanced (as torch-xla does) by every random op."""

    def __init__(self) -> None:
        self.seed = DEFAULT_SEED

    def next_generator(self) -> torch.Generator:
        """A generator for one random op; the seed moves on."""
        generator = torch.Generator().manual_seed(self.seed)
        self.seed = (self.seed * 1103515245 + 12345) % (1 << 63)
        return generator


RNG = XlaRng()


class XlaTensor(DeviceTensor):
    """A tensor on the mock ``xla`` device."""

    device_type = "xla"
    memory = DeviceMemory("xla")

    @classmethod
    def device_count(cls) -> int:
        return device_count()

    @property
    def is_xla(self) -> bool:
        return True

    @classmethod
    def current_index(cls) -> int:
        return replicas().local_ordinal

    @classmethod
    def generator_for(cls, index: int) -> torch.Generator:
        return RNG.next_generator()

    @classmethod
    def observe(cls, func: object, tensors: list[DeviceTensor], args: tuple, kwargs: dict) -> None:
        GRAPHS.record(func, (tuple(tensor.shape) for tensor in tensors))


class _DeviceModule:
    """``torch.xla_sim``: what torch asks of a PrivateUse1 backend's module."""

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return device_count()

    @staticmethod
    def current_device() -> int:
        return replicas().local_ordinal

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        """``torch.manual_seed`` calls this; the XLA RNG is seeded by ``xm.set_rng_state`` only."""


def device_count() -> int:
    """XLA devices a rank sees: ``SIMULATORS_XLA_DEVICE_COUNT``, else one per rank of the simulated machine."""
    return machine.device_count("xla", replicas().local_world_size)


def install() -> None:
    """Make ``xla`` tensors work in this process (``import torch_xla`` calls it)."""
    backend.install(XlaTensor, HIDDEN_NAME, _DeviceModule(), extra_keys=("XLA",), autocast_aliases=("xla",))


def device_type() -> str:
    """The PJRT device type the world pretends to be: ``PJRT_DEVICE`` (``"CPU"`` by default)."""
    return os.environ.get("PJRT_DEVICE", "CPU").upper()


def require_xla(tensors: list[torch.Tensor], operation: str) -> list[XlaTensor]:
    """``tensors``, checked to be on an ``xla`` device (an ``xm`` collective refuses others, as torch-xla does)."""
    for tensor in tensors:
        if not isinstance(tensor, XlaTensor):
            raise RuntimeError(
                f"{operation} expects tensors on an xla device, got one on {tensor.device} "
                f"(move it with .to(xm.xla_device()) first)"
            )
    return tensors  # type: ignore[return-value]
