"""Unit tests of accelerate_ref's big-model loading: bad input gets HF accelerate 1.15's error, warning or log line.

Each names the key, file or value at fault; a ``"disk"`` entry without an
offload folder is refused before anything is loaded or written.

Layerwise casting: weights stored low, upcast per forward, as HF 1.15's `attach_layerwise_casting_hooks`.

Compared with HF's function on the same model: which layers are hooked,
their stored dtypes, and the outputs of the forward.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from accelerate_ref import dispatch_model, init_empty_weights, load_checkpoint_and_dispatch
from accelerate_ref.big_modeling import attach_layerwise_casting_hooks
from accelerate_ref.hooks import LayerwiseCastingHook
from accelerate_ref.utils.modeling import get_max_memory, infer_auto_device_map, load_checkpoint_in_model
from conformance.support.models import Net, built


def _checkpoint(tmp_path, state=None):
    state = state if state is not None else {k: v.contiguous() for k, v in built(width=4, depth=1).state_dict().items()}
    path = tmp_path / "model.safetensors"
    save_file(state, str(path), metadata={"format": "pt"})
    return path


def _empty():
    with init_empty_weights():
        return Net(width=4, depth=1)


def test_device_map_naming_a_missing_module_is_warned_about_with_its_name(tmp_path):
    checkpoint = _checkpoint(tmp_path)
    model = _empty()
    load_checkpoint_in_model(model, checkpoint, device_map={"": "cpu", "blocks.7": "cpu"})  # HF ignores the key
    assert not model.embed.weight.is_meta
    with pytest.warns(UserWarning, match=r"do not match any submodules in the model: \['nothing'\]"):
        dispatch_model(built(width=4, depth=1), {"": "cpu", "nothing": "cpu"})


def test_budget_string_that_does_not_parse_names_the_value():
    with pytest.raises(ValueError, match="12 parsecs"):
        get_max_memory({0: "12 parsecs"})
    with pytest.raises(ValueError, match="Device gpu is not recognized"):
        infer_auto_device_map(built(width=4, depth=1), {"gpu": "1GB"})


def test_unexpected_weights_are_logged_and_missing_ones_left_alone(tmp_path, caplog):
    state = {k: v.contiguous() for k, v in built(width=4, depth=1).state_dict().items()}
    del state["head.weight"]
    state["extra.weight"] = torch.ones(2)
    checkpoint = _checkpoint(tmp_path, state)
    model = _empty()
    with caplog.at_level("WARNING", logger="accelerate_ref.utils.modeling"):
        load_checkpoint_in_model(model, checkpoint, device_map={"": "cpu"})
    assert "were not used when initializing Net: {'extra.weight'}" in caplog.text
    assert model.head.weight.is_meta, "a weight the checkpoint lacks stays as it was"


def test_folder_with_two_index_files_is_refused(tmp_path):
    for name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        (tmp_path / name).write_text(json.dumps({"weight_map": {}}))
    with pytest.raises(ValueError, match="containing more than one `.index.json` file"):
        load_checkpoint_in_model(_empty(), tmp_path, device_map={"": "cpu"})


def test_disk_entries_without_offload_folder_are_refused_before_anything_is_written(tmp_path):
    checkpoint = _checkpoint(tmp_path)
    model = _empty()
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(ValueError, match="please pass along an `offload_folder`"):
        load_checkpoint_in_model(model, checkpoint, device_map={"embed": "cpu", "blocks": "cpu", "head": "disk"})
    assert sorted(os.listdir(tmp_path)) == before
    assert model.embed.weight.is_meta, "nothing was loaded"
    with pytest.raises(ValueError, match="offload_dir"):
        dispatch_model(built(width=4, depth=1), {"embed": "cpu", "blocks": "cpu", "head": "disk"})


def test_shape_mismatch_names_both_shapes(tmp_path):
    state = {k: v.contiguous() for k, v in built(width=4, depth=1).state_dict().items()}
    state["blocks.0.a.bias"] = torch.zeros(7)
    with pytest.raises(ValueError, match=r'shape torch.Size\(\[7\]\) in "bias"'):
        load_checkpoint_in_model(_empty(), _checkpoint(tmp_path, state), device_map={"": "cpu"})


def test_unknown_strategy_names_the_choices(tmp_path):
    with pytest.raises(ValueError, match="balanced_low_0"):
        load_checkpoint_and_dispatch(_empty(), _checkpoint(tmp_path), device_map="fastest")


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


@pytest.fixture(scope="module")
def one_gpu():
    """A rank on the simulator's mock CUDA family (its device count and budget set by the rank function)."""
    from tests.simulators.devices.worlds import device_world

    yield from device_world("cuda", "1")


@pytest.mark.timeout(240)
def test_tied_weights_with_nested_cpu_offload_are_brought_to_the_gpu_once_as_hf(one_gpu):
    """HF's test_dispatch_model_tied_weights_memory_with_nested_offload_cpu on a mock GPU: the offloaded weight, read
    by its module and four submodules, comes to the GPU once per forward and leaves no copy behind; the dispatch
    places the GPU block's weight alone."""
    from tests.accelerate_ref import big_modeling_rank_functions as functions

    ours, theirs = (one_gpu.one(functions.tied_weights_with_nested_cpu_offload, impl) for impl in ("accelerate_ref", "accelerate"))
    assert ours == theirs
    weight_mb = functions.SIZE**2 * 4 / 1e6  # one weight: the dispatch places it, the forward adds the offloaded one
    assert ours == {"dispatch peak MB": weight_mb, "forward peak MB": round(2 * weight_mb, 1), "output matches": True,
                    "GPU copies kept": [0, 0]}
