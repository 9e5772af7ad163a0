"""``torch.npu``: device selection, RNG, memory queries, streams and events of the mock NPUs.

The functions are the NPU family's :class:`simulators.devices.families.runtime.DeviceRuntime`
(its module docstring states the rules): ``is_available()`` is true;
``device_count()`` is ``SIMULATORS_NPU_DEVICE_COUNT``, else the number of
ranks on this simulated machine; ``set_device`` / ``current_device`` select
this process's NPU (0 until set); the RNG functions act on each device's own
generator; the memory queries report each device's books; ``device``
arguments default to the current NPU.
"""
from __future__ import annotations

import functools
from types import SimpleNamespace

import torch

from simulators.devices.families import npu as _mock

globals().update(_mock.RUNTIME.api())

#: ``torch.npu.amp``: the NPU's autocast context and gradient scaler.
amp = SimpleNamespace(
    autocast=functools.partial(torch.autocast, "npu"),
    GradScaler=functools.partial(torch.amp.GradScaler, "npu"),
)
