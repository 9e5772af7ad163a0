"""Issue 13's engine internals: regional compilation, DDP kwargs, the tensor parallel plugin, LOMO.

Each test runs HF accelerate 1.15's object and accelerate_ref's on the same input and compares
what they produce (HF accelerate is installed with the `hf` extra). Compiles use the "eager"
backend (dynamo traces, nothing is generated), so each costs well under a second.
"""

from __future__ import annotations

import sys
import warnings
from types import MethodType

import pytest
import torch

pytest.importorskip("accelerate")

import accelerate  # noqa: E402
import accelerate.utils as hf_utils  # noqa: E402
from accelerate.utils import other as hf_other  # noqa: E402

import accelerate_ref  # noqa: E402
import accelerate_ref.utils as ref_utils  # noqa: E402
from accelerate_ref.utils import other as ref_other  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) + x


class OtherBlock(Block):
    pass


class Net(torch.nn.Module):
    """Repeated blocks one level down (``body.blocks``), as in a Transformers model."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(3, 4)
        self.body = torch.nn.Module()
        self.body.blocks = torch.nn.ModuleList(Block() for _ in range(3))
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.body.blocks:
            x = block(x)
        return self.head(x)


def _net(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    return Net()


def _tree(module: torch.nn.Module) -> list[tuple[str, str]]:
    """Every module's dotted name and class: what got compiled shows as an OptimizedModule."""
    return [(name, type(sub).__name__) for name, sub in module.named_modules()]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """A graph cached by an earlier test would not change results, but resetting keeps tests independent."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def fresh_states(fresh_accelerate_state):
    """Both implementations' process-wide state forgotten (HF's keeps the first Accelerator's plugins)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


# --------------------------------------------------------------------------
# Regional compilation (utils.other)
# --------------------------------------------------------------------------
def _predicate_inputs() -> dict[str, torch.nn.Module]:
    mixed = torch.nn.ModuleList([Block(), torch.nn.Linear(4, 4)])
    subclassed = torch.nn.ModuleList([Block(), OtherBlock()])  # OtherBlock is a Block: still repeated
    base_after = torch.nn.ModuleList([OtherBlock(), Block()])  # a Block is not an OtherBlock
    nested = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.ModuleList([Block(), Block()])))
    return {
        "net": _net(), "blocks": _net().body.blocks, "leaf": torch.nn.Linear(2, 2),
        "empty_list": torch.nn.ModuleList(), "mixed": mixed, "subclassed": subclassed,
        "base_after": base_after, "nested": nested, "sequential": torch.nn.Sequential(Block(), Block()),
    }


@pytest.mark.parametrize("name", sorted(_predicate_inputs()))
def test_repeated_block_predicates_match_hf(name: str) -> None:
    module = _predicate_inputs()[name]
    for predicate in ("is_repeated_blocks", "has_repeated_blocks", "has_compiled_regions"):
        assert getattr(ref_other, predicate)(module) == getattr(hf_other, predicate)(module), predicate


def test_compile_regions_compiles_the_blocks_hf_compiles_with_equal_outputs() -> None:
    model, x = _net(), torch.randn(5, 3)
    eager = model(x)
    ref = ref_utils.compile_regions(model, backend="eager")
    hf = hf_utils.compile_regions(model, backend="eager")
    assert _tree(ref) == _tree(hf)
    assert ("body.blocks.0", "OptimizedModule") in _tree(ref) and ("head", "OptimizedModule") in _tree(ref)
    assert type(ref) is Net and ref is not model and ref.body is not model.body
    assert ref.__dict__["_orig_mod"] is model and _tree(model) == _tree(_net())  # the input is left as it was
    assert ref.head.weight is model.head.weight  # the same parameters, not copies
    assert torch.equal(ref(x), hf(x)) and torch.equal(ref(x), eager)
    assert ref_other.has_compiled_regions(ref) and hf_other.has_compiled_regions(hf)


def test_compile_regions_on_a_list_or_a_leaf_matches_hf() -> None:
    for module in (_net().body.blocks, torch.nn.Linear(3, 3)):
        ref = ref_utils.compile_regions(module, backend="eager")
        hf = hf_utils.compile_regions(module, backend="eager")
        assert _tree(ref) == _tree(hf)
        assert ref.__dict__["_orig_mod"] is module


def test_compile_regions_rebinds_a_patched_method_to_the_copy() -> None:
    model = _net()
    model.forward = MethodType(lambda self, x: Net.forward(self, x) * 2, model)  # a bound method in __dict__
    x = torch.randn(2, 3)
    for impl in (ref_utils, hf_utils):
        compiled = impl.compile_regions(model, backend="eager")
        assert compiled.forward.__self__ is compiled
        assert torch.equal(compiled(x), model(x))


@pytest.mark.parametrize("variant", ["compile_regions_fsdp2", "compile_regions_deepspeed"])
def test_in_place_variants_compile_the_same_modules_as_hf(variant: str) -> None:
    x = torch.randn(4, 3)
    results = []
    for impl in (ref_utils, hf_utils):
        model = _net()
        returned = getattr(impl, variant)(model, backend="eager")
        compiled = [name for name, sub in model.named_modules() if sub._compiled_call_impl is not None]
        results.append((returned is model, returned is None, compiled, model(x)))
    (ref_returned, ref_none, ref_compiled, ref_out), (hf_returned, hf_none, hf_compiled, hf_out) = results
    assert (ref_returned, ref_none, ref_compiled) == (hf_returned, hf_none, hf_compiled)
    assert ref_compiled == ["embed", "body.blocks.0", "body.blocks.1", "body.blocks.2", "head"]
    assert torch.equal(ref_out, hf_out)


@pytest.mark.parametrize("keep", [True, False])
def test_extract_model_from_parallel_unwraps_regional_compilation_as_hf(keep: bool) -> None:
    model = _net()
    for impl, other in ((ref_utils, ref_other), (hf_utils, hf_other)):
        compiled = impl.compile_regions(model, backend="eager")
        unwrapped = other.extract_model_from_parallel(compiled, keep_torch_compile=keep)
        assert unwrapped is (compiled if keep else model), impl.__name__


# --------------------------------------------------------------------------
# TorchDynamoPlugin.use_regional_compilation, taking effect in prepare
# --------------------------------------------------------------------------
@pytest.mark.parametrize("env", [None, "true", "false"])
def test_dynamo_plugin_fields_and_kwargs_match_hf(monkeypatch: pytest.MonkeyPatch, env: str | None) -> None:
    if env is not None:
        monkeypatch.setenv("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", env)
    for kwargs in ({}, {"backend": "eager"}, {"backend": "eager", "use_regional_compilation": True}):
        ref, hf = ref_utils.TorchDynamoPlugin(**kwargs), hf_utils.TorchDynamoPlugin(**kwargs)
        assert ref.use_regional_compilation == hf.use_regional_compilation
        assert ref.to_dict() == hf.to_dict()
        assert ref.to_kwargs() == hf.to_kwargs()
        assert "use_regional_compilation" not in ref.to_kwargs()


def _prepare_compiled(impl, model: torch.nn.Module, regional: bool) -> tuple:
    plugin = impl.utils.TorchDynamoPlugin(backend="eager", use_regional_compilation=regional)
    accelerator = impl.Accelerator(cpu=True, dynamo_plugin=plugin)
    return accelerator, accelerator.prepare(model)


def test_prepare_with_regional_compilation_matches_hf(fresh_states) -> None:
    x = torch.randn(6, 3)
    eager = _net()(x)
    ref_acc, ref_model = _prepare_compiled(accelerate_ref, _net(), regional=True)
    hf_acc, hf_model = _prepare_compiled(accelerate, _net(), regional=True)
    assert _tree(ref_model) == _tree(hf_model)
    assert type(ref_model) is Net and ref_utils.has_compiled_regions(ref_model)
    assert torch.equal(ref_model(x), eager) and torch.equal(hf_model(x), eager)
    bare = ref_acc.unwrap_model(ref_model, keep_torch_compile=False)
    assert _tree(bare) == _tree(hf_acc.unwrap_model(hf_model, keep_torch_compile=False)) == _tree(_net())
    assert ref_acc.unwrap_model(ref_model) is ref_model


def test_training_through_regionally_compiled_blocks_matches_eager(fresh_states) -> None:
    x, target = torch.randn(6, 3), torch.randn(6, 2)
    results = []
    for regional in (True, False):
        torch._dynamo.reset()
        accelerator, model = _prepare_compiled(accelerate_ref, _net(), regional=regional)
        optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
        for _ in range(2):
            accelerator.backward(torch.nn.functional.mse_loss(model(x), target))
            optimizer.step()
            optimizer.zero_grad()
        results.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
        accelerate_ref.state.AcceleratorState._reset_state(True)
        accelerate_ref.state.GradientState._reset_state()
    assert torch.allclose(results[0], results[1], atol=1e-6)


def test_prepare_without_regional_compilation_compiles_the_whole_model(fresh_states) -> None:
    _, model = _prepare_compiled(accelerate_ref, _net(), regional=False)
    assert type(model).__name__ == "OptimizedModule" and not ref_utils.has_compiled_regions(model._orig_mod)


# --------------------------------------------------------------------------
# DDP kwargs and the comm hook enum
# --------------------------------------------------------------------------
@pytest.mark.parametrize("ignore_keys", [None, (), ("dim", "comm_hook"), ["bucket_cap_mb"]])
def test_ddp_kwargs_to_dict_matches_hf(ignore_keys) -> None:
    fields = {"bucket_cap_mb": 10, "comm_hook": "fp16", "comm_state_option": {"matrix_approximation_rank": 2}}
    ref, hf = ref_utils.DistributedDataParallelKwargs(**fields), hf_utils.DistributedDataParallelKwargs(**fields)
    args = () if ignore_keys is None else (ignore_keys,)
    ref_dict, hf_dict = ref.to_dict(*args), hf.to_dict(*args)
    assert {k: str(v) for k, v in ref_dict.items()} == {k: str(v) for k, v in hf_dict.items()}
    assert {k: str(v) for k, v in ref.to_kwargs().items()} == {k: str(v) for k, v in hf.to_kwargs().items()}
    assert ref.to_kwargs() == {"bucket_cap_mb": 10}


def test_ddp_comm_hook_type_is_exported_at_the_top_level_as_hf() -> None:
    assert accelerate_ref.DDPCommunicationHookType is ref_utils.DDPCommunicationHookType
    assert "DDPCommunicationHookType" in accelerate_ref.__all__
    ref, hf = accelerate_ref.DDPCommunicationHookType, accelerate.DDPCommunicationHookType
    assert ref.list() == hf.list()
    assert [(m.name, str(m)) for m in ref] == [(m.name, str(m)) for m in hf]


# --------------------------------------------------------------------------
# TorchTensorParallelPlugin
# --------------------------------------------------------------------------
def test_tensor_parallel_plugin_fields_match_hf() -> None:
    import dataclasses

    def defaults(cls: type) -> list:
        return [(f.name, f.default) for f in dataclasses.fields(cls)]

    assert defaults(ref_utils.TorchTensorParallelPlugin) == defaults(hf_utils.TorchTensorParallelPlugin)
    assert ref_utils.TorchTensorParallelPlugin(tp_size=2).tp_size == 2


def test_tensor_parallel_plugin_of_size_one_warns_as_hf_and_trains_as_without(fresh_states) -> None:
    messages = []
    for impl in (accelerate_ref, accelerate):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            accelerator = impl.Accelerator(cpu=True, torch_tp_plugin=impl.utils.TorchTensorParallelPlugin())
        messages.append([str(w.message) for w in caught if issubclass(w.category, FutureWarning)])
        model = accelerator.prepare(torch.nn.Linear(2, 2))
        assert type(model) is torch.nn.Linear
    assert messages[0] == messages[1] and len(messages[0]) == 1


def test_tensor_parallel_beyond_one_is_refused_naming_it(fresh_states) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with pytest.raises(NotImplementedError, match="tp_size=2"):
            accelerate_ref.Accelerator(cpu=True, torch_tp_plugin=ref_utils.TorchTensorParallelPlugin(tp_size=2))
    with pytest.raises(TypeError, match="torch_tp_plugin"):
        accelerate_ref.Accelerator(cpu=True, torch_tp_plugin=object())


# --------------------------------------------------------------------------
# LOMO (lomo-optim, extra `lomo`)
# --------------------------------------------------------------------------
def _lomo_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.fixture
def lomo_class() -> type:
    """lomo_optim's Lomo (its AdaLomo allocates its state with ``.cuda()``: it cannot run on this machine)."""
    return pytest.importorskip("lomo_optim").Lomo


def _lomo_steps(impl, lomo_class: type, backward) -> torch.Tensor:
    """Two fused LOMO backward passes through a prepared LOMO optimizer; the parameters they leave."""
    model = _lomo_model()
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    accelerator = impl.Accelerator(cpu=True)
    model, _ = accelerator.prepare(model, lomo_class(model, lr=1e-2))
    for _ in range(2):
        backward(accelerator, torch.nn.functional.mse_loss(model(x), y), 0.05)
    return _flat(model)


def test_lomo_backward_updates_as_hf(fresh_states, lomo_class: type) -> None:
    from accelerate_ref._accelerator.lomo import lomo_backward

    hf = _lomo_steps(accelerate, lomo_class, lambda acc, loss, lr: acc.lomo_backward(loss, lr))
    ref = _lomo_steps(accelerate_ref, lomo_class, lambda acc, loss, lr: lomo_backward(acc._optimizers, loss, lr))
    assert not torch.equal(ref, _flat(_lomo_model()))  # the fused backward updated the parameters
    assert torch.equal(ref, hf)


def test_lomo_backward_refusals_match_hf(fresh_states) -> None:
    from accelerate_ref._accelerator.lomo import lomo_backward

    model = torch.nn.Linear(2, 1)
    loss = model(torch.randn(3, 2)).sum()
    plain = accelerate_ref.Accelerator(cpu=True).prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="A learning rate must be passed"):
        lomo_backward([plain], loss, None)
    with pytest.raises(ValueError, match="Are you sure you passed a LOMO optimizer"):
        lomo_backward([plain], loss, 0.1)


def test_telling_a_lomo_optimizer_imports_nothing(monkeypatch, lomo_class: type) -> None:
    """An optimizer can be a Lomo only once lomo_optim is imported: before that the check answers no without
    importing it (and Transformers with it); after, it tells a Lomo from a plain optimizer."""
    from accelerate_ref._accelerator.lomo import is_lomo_optimizer

    model = torch.nn.Linear(2, 1)
    lomo = lomo_class(model, lr=1e-2)
    plain = torch.optim.SGD(model.parameters(), lr=0.1)
    assert (is_lomo_optimizer(lomo), is_lomo_optimizer(plain)) == (True, False)
    monkeypatch.delitem(sys.modules, "lomo_optim")
    assert not is_lomo_optimizer(plain)
    assert "lomo_optim" not in sys.modules, "telling a plain optimizer imported lomo_optim"


@pytest.mark.skipif(not hasattr(accelerate_ref.Accelerator, "lomo_backward"), reason="Accelerator delegates at merge")
def test_accelerator_lomo_backward_and_backward_with_learning_rate_match_hf(fresh_states, lomo_class) -> None:
    hf = _lomo_steps(accelerate, lomo_class, lambda acc, loss, lr: acc.backward(loss, learning_rate=lr))
    ref = _lomo_steps(accelerate_ref, lomo_class, lambda acc, loss, lr: acc.backward(loss, learning_rate=lr))
    assert torch.equal(ref, hf)
    by_method = _lomo_steps(accelerate_ref, lomo_class, lambda acc, loss, lr: acc.lomo_backward(loss, lr))
    assert torch.equal(by_method, _lomo_steps(accelerate, lomo_class, lambda acc, loss, lr: acc.lomo_backward(loss, lr)))
