"""Functions the mock-GPU ranks of tests/accelerate_ref/test_big_modeling.py call. Holds no tests."""

from __future__ import annotations

import importlib
import os
from typing import Any

#: One weight of the tied-weights model: a ``SIZE x SIZE`` float32 matrix (16 MiB: a large-pool request of 10 MiB
#: or more takes a segment of its own size from the caching allocator, as HF's 100 MB weights do; a smaller one
#: would take a 20 MiB segment, more than the headroom below holds).
SIZE = 2048
#: HF's test leaves 1.5 weights free beside the two the forward needs (150 MB beside 2 x 100 MB).
HEADROOM = 1.5


def _tied_weights_model() -> Any:
    """HF's ModelWithSubmodules: two linears (``compute``, ``compute1``), each weight shared with four submodules
    that read it in the forward."""
    import torch

    class SubModule(torch.nn.Module):
        def __init__(self, shared: torch.nn.Parameter) -> None:
            super().__init__()
            self.parameter = shared

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.max(self.parameter)

    class LinearAndSubModules(torch.nn.Linear):
        def __init__(self) -> None:
            super().__init__(SIZE, SIZE, bias=False)
            self.subs = torch.nn.ModuleList(SubModule(self.weight) for _ in range(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return sum(torch.nn.functional.linear(sub(x), self.weight) for sub in self.subs)

    class ModelWithSubmodules(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.compute = LinearAndSubModules()
            self.compute1 = LinearAndSubModules()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.compute(x) + self.compute1(x)

    torch.manual_seed(0)
    return ModelWithSubmodules()


def tied_weights_with_nested_cpu_offload(impl: str) -> dict[str, Any]:
    """HF's test_dispatch_model_tied_weights_memory_with_nested_offload_cpu, scaled down, on one mock GPU of 256 MB:
    ``compute`` on the GPU, ``compute1`` offloaded to the CPU, the GPU filled but for the two weights and 1.5 more.
    Returns the GPU memory the dispatch and the forward took (MB over the filler), whether the output matches the
    CPU model's, and the GPU copies the tied-weights map keeps for the offloaded weight after the forward; or the
    error, with its type."""
    import torch

    os.environ["SIMULATORS_CUDA_DEVICE_COUNT"], os.environ["SIMULATORS_DEVICE_MEMORY"] = "1", "256MB"
    torch.cuda.empty_cache()  # the segments an earlier call left cached (one rank serves both implementations)
    # the cuBLAS workspace a thread's first matmul keeps (32 MiB on Hopper), taken before the filler is sized
    (torch.ones(1, 1, device="cuda") @ torch.ones(1, 1, device="cuda")).cpu()
    dispatch_model = importlib.import_module(f"{impl}.big_modeling").dispatch_model
    model = _tied_weights_model()
    x = torch.randn(1, SIZE)
    with torch.no_grad():
        expected = model(x)
    weight_bytes = SIZE * SIZE * 4
    filler = torch.empty((torch.cuda.mem_get_info(0)[0] - int((2 + HEADROOM) * weight_bytes)) // 4, device="cuda")
    base = torch.cuda.memory_allocated(0)
    torch.cuda.reset_peak_memory_stats(0)
    seen: dict[str, Any] = {}
    try:
        dispatch_model(model, {"compute": "cuda", "compute1": "cpu"})
        seen["dispatch peak MB"] = (torch.cuda.max_memory_allocated(0) - base) / 1e6
        offloaded = model.compute1._hf_hook.weights_map["weight"].data_ptr()
        torch.cuda.reset_peak_memory_stats(0)
        with torch.no_grad():
            output = model(x)
        seen["forward peak MB"] = round((torch.cuda.max_memory_allocated(0) - base) / 1e6, 1)
        seen["output matches"] = torch.allclose(expected, output.cpu(), atol=1e-4, rtol=1e-4)
        seen["GPU copies kept"] = [len(hook.tied_params_map[offloaded])
                                   for hook in (model.compute1._hf_hook, model.compute1.subs[0]._hf_hook)]
    except Exception as error:  # noqa: BLE001 - the failure is the observation
        seen["error"] = f"{type(error).__name__}: {error}"
    del filler
    return seen
