"""The small big-model helpers of `accelerate_ref.utils.modeling`, each checked against HF accelerate 1.15's on the same input.

Fast (tiny models, no processes): tie checks, module leaves and sizes
with ties, ``fallback_allocate``, storage ids, non-persistent buffers,
offloaded modules' state dicts, the grad scaler / autocast helpers.
"""

from __future__ import annotations

import sys
import types
import warnings

import pytest
import torch
from torch import nn

from accelerate_ref import Accelerator

hf_modeling = pytest.importorskip("accelerate.utils.modeling")

from accelerate_ref import cpu_offload  # noqa: E402
from accelerate_ref.utils import modeling  # noqa: E402
from conformance.support.models import built  # noqa: E402


class WithBuffers(nn.Module):
    def __init__(self, own_non_persistent: bool = False) -> None:
        super().__init__()
        self.inner = nn.Module()
        self.inner.register_buffer("kept", torch.ones(2))
        self.inner.register_buffer("scratch", torch.zeros(2), persistent=False)
        self.inner.deeper = nn.Module()
        self.inner.deeper.register_buffer("cache", torch.zeros(1), persistent=False)
        if own_non_persistent:
            self.register_buffer("mine", torch.zeros(1), persistent=False)


@pytest.mark.parametrize(
    "first, second",
    [("cpu", "cpu"), ("cuda", "cuda:0"), ("cuda:0", "cuda:1"), ("cpu", "cuda"), ("xpu", "xpu:0"), ("meta", "meta")],
)
def test_check_device_same_matches_hf(first, second):
    pair = torch.device(first), torch.device(second)
    assert modeling.check_device_same(*pair) == hf_modeling.check_device_same(*pair)
    assert modeling.check_device_same(torch.device("cuda"), torch.device("cuda:0"))
    assert not modeling.check_device_same(torch.device("cuda"), torch.device("cuda:1"))


@pytest.mark.parametrize("recurse", [False, True])
@pytest.mark.parametrize("fqns", [False, True])
def test_get_non_persistent_buffers_matches_hf(recurse, fqns):
    model = WithBuffers()  # its root has no non-persistent buffer of its own, so HF's ".name" artefact is absent
    assert modeling.get_non_persistent_buffers(model, recurse, fqns) == hf_modeling.get_non_persistent_buffers(model, recurse, fqns)


def test_get_non_persistent_buffers_lists_the_modules_own_buffers_twice_as_hf_does():
    model = WithBuffers(own_non_persistent=True)
    ours = modeling.get_non_persistent_buffers(model, recurse=True, fqns=True)
    assert ours == {"mine", ".mine", "inner.scratch", "inner.deeper.cache"}  # HF's ".mine": the root's name is ""
    assert hf_modeling.get_non_persistent_buffers(model, recurse=True, fqns=True) == ours
    assert modeling.get_non_persistent_buffers(model.inner) == hf_modeling.get_non_persistent_buffers(model.inner) == {"scratch"}
    assert modeling.get_non_persistent_buffers(model.inner, recurse=True) == {"scratch", "cache"}


def test_id_tensor_storage_is_shared_by_views_and_matches_hf():
    base = torch.arange(12, dtype=torch.float32)
    view, copy = base.view(3, 4)[1], base.clone()
    assert modeling.id_tensor_storage(view) == modeling.id_tensor_storage(base)
    assert modeling.id_tensor_storage(copy) != modeling.id_tensor_storage(base)
    assert modeling.id_tensor_storage(base) == (torch.device("cpu"), base.data_ptr(), 48)
    for tensor in (base, view, torch.ones(2, dtype=torch.int8), torch.empty(5, device="meta")):
        assert modeling.id_tensor_storage(tensor) == hf_modeling.id_tensor_storage(tensor)


def test_get_module_leaves_matches_hf():
    sizes = modeling.compute_module_sizes(built(width=4, depth=2))
    leaves = modeling.get_module_leaves(sizes)
    assert leaves == hf_modeling.get_module_leaves(sizes)
    assert "embed.weight" in leaves and "blocks" not in leaves and "" not in leaves
    odd = {"": 9, "a": 5, "a.b.c": 2, "d": 4}  # "a.b" absent: "a" has no direct child
    assert modeling.get_module_leaves(odd) == hf_modeling.get_module_leaves(odd) == ["a", "a.b.c", "d"]


def test_module_size_with_ties_and_fallback_allocate_match_hf():
    model = built(width=4, depth=2, tie=True)
    sizes = modeling.compute_module_sizes(model)
    tied = modeling.find_tied_parameters(model)
    entries = list(model.named_children())
    args = (["head.weight"], sizes["embed"], sizes, entries[1:])
    assert modeling.get_module_size_with_ties(*args) == hf_modeling.get_module_size_with_ties(*args)
    assert modeling.get_module_size_with_ties([], 7, sizes, entries) == (7, [], [])
    untied = built(width=4, depth=2)
    untied_sizes = modeling.compute_module_sizes(untied)
    cases = [(entries, sizes, tied, limit) for limit in (sizes["embed"], sizes["blocks"], "1KB", "not a size", 10**9)]
    cases += [(list(untied.named_children()), untied_sizes, [], limit) for limit in (0, 100, untied_sizes["blocks.0"])]
    for named, module_sizes, groups, limit in cases:
        ours = modeling.fallback_allocate(list(named), module_sizes, limit, ["Probe"], groups)
        theirs = hf_modeling.fallback_allocate(list(named), module_sizes, limit, ["Probe"], groups)  # HF may change the list
        assert (ours[0], [n for n, _ in ours[2]]) == (theirs[0], [n for n, _ in theirs[2]]), limit
        assert ours[1] is theirs[1]
    name, module, rest = modeling.fallback_allocate(list(untied.named_children()), untied_sizes, 100, ["Probe"])
    assert name == "blocks.0.a" and module is untied.blocks[0].a
    assert [n for n, _ in rest] == ["embed", "blocks.0.b", "blocks.1", "head"]
    with pytest.raises(IndexError):  # as HF's: the twin's module is no longer a candidate
        modeling.fallback_allocate(entries, sizes, 0, ["Probe"], tied)


def test_check_tied_parameters_in_config_matches_hf():
    class PreTrainedModel(nn.Module):  # stands for transformers' class, recognised by name as HF does
        def __init__(self, **config: bool) -> None:
            super().__init__()
            self.config = types.SimpleNamespace(**config)
            self.out = nn.Linear(2, 2)

        def get_output_embeddings(self) -> nn.Module:
            return self.out

    for model in (built(width=4, depth=1), PreTrainedModel(), PreTrainedModel(tie_word_embeddings=True),
                  PreTrainedModel(is_encoder_decoder=True, tie_encoder_decoder=True), PreTrainedModel(is_encoder_decoder=True)):
        assert modeling.check_tied_parameters_in_config(model) == hf_modeling.check_tied_parameters_in_config(model)
    assert modeling.check_tied_parameters_in_config(PreTrainedModel(tie_word_embeddings=True))
    assert not modeling.check_tied_parameters_in_config(PreTrainedModel(is_encoder_decoder=True))


def test_check_tied_parameters_on_same_device_logs_only_when_split(caplog):
    tied = [["embed.weight", "head.weight"]]
    with caplog.at_level("WARNING", logger="accelerate_ref.utils.modeling"):
        modeling.check_tied_parameters_on_same_device(tied, {"": "cpu", "blocks": "disk"})
        assert not caplog.records
        modeling.check_tied_parameters_on_same_device(tied, {"embed": "cpu", "blocks": "cpu", "head": "disk"})
    assert [record.getMessage() for record in caplog.records] == [
        "Tied parameters are on different devices: {'embed.weight': 'cpu', 'head.weight': 'disk'}. "
        "Please modify your custom device map or set `device_map='auto'`. "
    ]


def test_offloaded_module_helpers_match_hf():
    import accelerate

    reference = built(width=4, depth=1).state_dict()
    ours, theirs = built(width=4, depth=1), built(width=4, depth=1)
    cpu_offload(ours, execution_device="cpu")
    accelerate.cpu_offload(theirs, execution_device="cpu")
    for name in ("", "embed", "blocks.0.a"):  # the root's hook only moves inputs; the weights' modules offload
        offloaded = modeling.has_offloaded_params(ours.get_submodule(name))
        assert offloaded == hf_modeling.has_offloaded_params(theirs.get_submodule(name)) == bool(name)
    assert not modeling.has_offloaded_params(built(width=4, depth=1).embed)
    assert ours.embed.weight.is_meta
    with modeling.align_module_device(ours.embed):
        assert torch.equal(ours.embed.weight, reference["embed.weight"])
    assert ours.embed.weight.is_meta and ours.embed._hf_hook.execution_device == "cpu"
    with modeling.align_module_device(ours.head, torch.device("cpu")):
        assert ours.head.weight.device == torch.device("cpu")
    assert ours.head.weight.is_meta and ours.head._hf_hook.execution_device == "cpu"
    ours_state = modeling.get_state_dict_offloaded_model(ours)
    assert ours_state.keys() == hf_modeling.get_state_dict_offloaded_model(theirs).keys() == reference.keys()
    assert all(torch.equal(ours_state[k], reference[k]) for k in reference)
    partial = {"head.weight": "placeholder"}
    filled = modeling.get_state_dict_from_offload(ours.head, "head.weight", partial)
    assert filled is partial and torch.equal(partial["head.weight"], reference["head.weight"])
    plain = built(width=4, depth=1)
    assert torch.equal(modeling.get_state_dict_from_offload(plain.head, "head.weight", {"head.weight": None})["head.weight"],
                       reference["head.weight"])


def test_get_grad_scaler_matches_hf():
    from accelerate.utils import DistributedType as HFDistributedType

    from accelerate_ref.utils import DistributedType

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch disables a CUDA scaler on a CPU-only host, with a warning
        plain, hf_plain = modeling.get_grad_scaler(), hf_modeling.get_grad_scaler()
        sharded, hf_sharded = modeling.get_grad_scaler(DistributedType.FSDP), hf_modeling.get_grad_scaler(HFDistributedType.FSDP)
    assert type(plain) is type(hf_plain) and plain._device == hf_plain._device
    assert type(sharded) is type(hf_sharded)
    assert modeling.get_grad_scaler(enabled=False)._enabled is False  # kwargs reach the constructor
    assert type(sharded).__name__ == "ShardedGradScaler"


def test_get_mixed_precision_context_manager_follows_the_state(fresh_accelerate_state):
    from accelerate_ref.utils import AutocastKwargs

    Accelerator(mixed_precision="bf16", cpu=True)
    with modeling.get_mixed_precision_context_manager(native_amp=False):
        assert not torch.is_autocast_enabled("cpu")
    with modeling.get_mixed_precision_context_manager(native_amp=True):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with modeling.get_mixed_precision_context_manager(True, AutocastKwargs(enabled=False)):
        assert not torch.is_autocast_enabled("cpu")


def test_is_peft_model(monkeypatch):
    plain = built(width=4, depth=1)
    assert modeling.is_peft_model(plain) is hf_modeling.is_peft_model(plain) and not modeling.is_peft_model(plain)  # None without peft
    fake_peft = types.ModuleType("peft")

    class PeftModel(nn.Module):
        pass

    fake_peft.PeftModel = PeftModel
    monkeypatch.setitem(sys.modules, "peft", fake_peft)
    monkeypatch.setattr("accelerate_ref.utils.imports.is_peft_available", lambda: True)
    assert modeling.is_peft_model(PeftModel())
    assert not modeling.is_peft_model(built(width=4, depth=1))


def _saved(tmp_path, model, drop=()):
    from safetensors.torch import save_file

    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "model.safetensors"
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k not in drop}
    save_file(state, str(path), metadata={"format": "pt"})
    return path


def test_load_checkpoint_in_model_full_state_dict_changes_nothing_on_an_unsharded_model(tmp_path):
    source = built(seed=1, width=4, depth=1)
    path = _saved(tmp_path, source)
    for full_state_dict in (True, False):
        target = built(seed=2, width=4, depth=1)
        modeling.load_checkpoint_in_model(target, path, full_state_dict=full_state_dict)
        assert all(torch.equal(target.state_dict()[k], v) for k, v in source.state_dict().items())
    with pytest.raises(ValueError, match="process group"):
        modeling.load_checkpoint_in_model(built(width=4, depth=1), path, broadcast_from_rank0=True)
    assert modeling.WEIGHTS_INDEX_NAME == hf_modeling.WEIGHTS_INDEX_NAME


def test_broadcast_from_rank0_gives_every_rank_rank_0s_file(tmp_path):
    from simulators.launcher import run
    from tests.accelerate_ref.utils import modeling_rank_functions

    source = built(seed=1, width=4, depth=1)
    expected = {name: tensor.flatten().tolist() for name, tensor in source.state_dict().items()}
    full, partial = _saved(tmp_path / "full", source), _saved(tmp_path / "partial", source, drop=("head.weight",))
    results = run(modeling_rank_functions.load_broadcast_from_rank0, world=2, args=(str(full), str(partial)), timeout=60)
    for loaded, strict_error in results:
        assert loaded == expected
        assert "head.weight" in strict_error  # strict: every rank refuses, naming the missing weight


@pytest.mark.usefixtures('fresh_accelerate_state')
@pytest.mark.parametrize("impl", ["accelerate_ref", "accelerate"])
def test_load_checkpoint_reads_a_bare_weight_map_and_logs_unused_keys(impl: str, tmp_path, caplog) -> None:
    """An index JSON that is the weight map itself loads; unused checkpoint keys are logged in HF's words."""
    import importlib
    import json

    from safetensors.torch import save_file

    modeling = importlib.import_module(f"{impl}.utils.modeling")
    source = torch.nn.Linear(2, 1)
    weights = {"weight": source.weight.detach().clone(), "bias": source.bias.detach().clone(), "stray": torch.ones(1)}
    save_file(weights, str(tmp_path / "shard-1.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({name: "shard-1.safetensors" for name in weights}))
    model = torch.nn.Linear(2, 1)
    with caplog.at_level("WARNING"):
        modeling.load_checkpoint_in_model(model, str(tmp_path / "model.safetensors.index.json"))
    assert torch.equal(model.weight, source.weight) and torch.equal(model.bias, source.bias)
    assert any("were not used when initializing Linear" in record.getMessage() and "stray" in record.getMessage()
               for record in caplog.records)
