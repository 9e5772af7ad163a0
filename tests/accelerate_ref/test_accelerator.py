"""The reference's training path on one process.

Catalog: prepare.*, backward.loss, accumulate.*, clip.*, unscale.noop,
autocast.*, free_memory.resets, memory.find_executable_batch_size,
profile.context, join.uneven_inputs (one process), unwrap.keep_fp32_wrapper.
The multi-rank behaviour (DDP, synchronisation, joining) is in
``test_training_ranks.py``.
"""

from __future__ import annotations

import gc
import json
import weakref

import accelerate.accelerator as hf_accelerator  # noqa: E402
import accelerate.utils as hf_utils  # noqa: E402
import pytest
import torch

import accelerate_ref.utils as ref_utils  # noqa: E402
from accelerate_ref import (
    Accelerator,
    AcceleratorState,
    AutocastKwargs,
    GradientAccumulationPlugin,
    GradientState,
    GradScalerKwargs,
    ProfileKwargs,
    ProjectConfiguration,
)
from accelerate_ref import state as state_module
from accelerate_ref.optimizer import AcceleratedOptimizer
from accelerate_ref.scheduler import AcceleratedScheduler
from accelerate_ref.utils import extract_model_from_parallel, is_compiled_module
from accelerate_ref.utils.memory import find_executable_batch_size, release_memory, should_reduce_batch_size
from tests.side_by_side import both_states

LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")
OOM = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 1099511627776 bytes."


@pytest.fixture(autouse=True)
def one_process(monkeypatch):
    for name in LAUNCH_ENV + ("ACCELERATE_MIXED_PRECISION", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS"):
        monkeypatch.delenv(name, raising=False)
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def linear(seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(3, 1)


def objects(model=None):
    model = model or linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)
    return model, optimizer, scheduler


def weights(model) -> list[float]:
    return torch.nn.utils.parameters_to_vector(model.parameters()).tolist()


def step_loss(model, value: float = 1.0) -> torch.Tensor:
    return (model(torch.full((2, 3), value)) ** 2).mean()


# -- prepare ---------------------------------------------------------------------


def test_prepare_keeps_order_and_passes_unknown_objects_through():
    acc = Accelerator()
    model, optimizer, scheduler = objects()
    loader = torch.utils.data.DataLoader(list(range(4)), batch_size=2)
    marker = object()
    got = acc.prepare(scheduler, marker, loader, optimizer, model, "text")
    assert isinstance(got[0], AcceleratedScheduler) and got[0].scheduler is scheduler
    assert got[1] is marker and got[5] == "text"
    assert [batch.tolist() for batch in got[2]] == [[0, 1], [2, 3]]
    assert isinstance(got[3], AcceleratedOptimizer) and got[3].optimizer is optimizer
    assert got[0].optimizers == [got[3]], "the scheduler follows its own prepared optimizer"
    assert got[4] is model
    assert acc.prepare(model) is model, "one object comes back alone, and a prepared model is not prepared again"
    assert acc._models == [model] and acc._optimizers == [got[3]] and len(acc._dataloaders) == 1


def test_device_placement_needs_one_flag_per_object():
    acc = Accelerator()
    with pytest.raises(ValueError, match=r"`device_placement` should be a list with 2 elements"):
        acc.prepare(linear(), linear(), device_placement=[True])


def test_device_placement_flags_reach_each_object(monkeypatch):
    acc = Accelerator()
    moved = []
    model = linear()
    monkeypatch.setattr(model, "to", lambda device: moved.append(device) or model)
    loader = torch.utils.data.DataLoader(list(range(4)), batch_size=2)
    kept, placed_loader = acc.prepare(model, loader, device_placement=[False, True])
    assert moved == [] and placed_loader.device == acc.device
    acc.prepare_model(linear(), device_placement=None)
    acc.prepare_model(model)
    assert moved == [], "an already prepared model is not placed again"


def test_a_scheduler_without_its_prepared_optimizer_follows_every_prepared_optimizer():
    """HF 1.15: a scheduler whose optimizer was not prepared steps with all the prepared ones."""
    acc = Accelerator()
    _, _, scheduler = objects()
    assert acc.prepare_scheduler(scheduler).optimizers == []
    other = acc.prepare_optimizer(torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1))
    assert acc.prepare_scheduler(objects()[2]).optimizers == [other]


def test_a_scheduler_built_on_the_prepared_optimizer_is_accepted():
    acc = Accelerator()
    model, optimizer, _ = objects()
    prepared = acc.prepare_optimizer(optimizer)
    scheduler = acc.prepare_scheduler(torch.optim.lr_scheduler.StepLR(prepared, 1, gamma=0.5))
    assert scheduler.optimizers == [prepared]


def test_evaluation_mode_and_device_map_on_one_process():
    acc = Accelerator()
    model = linear()
    model.hf_device_map = {"weight": "cpu", "bias": "disk"}
    assert acc.verify_device_map(model) and acc.verify_device_map(torch.nn.Sequential(model))
    assert acc.prepare_model(model, evaluation_mode=True) is model, "one process: a dispatched model is accepted"
    assert not acc.verify_device_map(linear())


def test_unwrap_model_peels_containers_and_the_fp32_wrapper():
    acc = Accelerator(mixed_precision="bf16")
    model = linear()
    acc.prepare(model)
    assert model(torch.ones(1, 3)).dtype == torch.float32, "outputs converted back to fp32"
    wrapped = torch.nn.DataParallel(model)
    assert acc.unwrap_model(wrapped) is model
    assert "_original_forward" in model.__dict__, "keep_fp32_wrapper=True keeps it"
    acc.unwrap_model(wrapped, keep_fp32_wrapper=False)
    assert "_original_forward" not in model.__dict__
    assert model.forward.__func__ is torch.nn.Linear.forward
    assert not is_compiled_module(model)
    assert extract_model_from_parallel(model) is model


# -- optimizer and scheduler --------------------------------------------------------


def test_optimizer_and_scheduler_step_only_on_synchronised_steps():
    acc = Accelerator(gradient_accumulation_steps=2)
    model, optimizer, scheduler = acc.prepare(*objects())
    moved, rates, syncs = [], [], []
    for _ in range(4):
        with acc.accumulate(model):
            before = weights(model)
            acc.backward(step_loss(model))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            moved.append(weights(model) != before)
            rates.append(scheduler.get_last_lr()[0])
            syncs.append(acc.sync_gradients)
    assert syncs == moved == [False, True, False, True]
    assert rates == [1.0, 0.5, 0.5, 0.25]
    assert acc.step == 4


def test_zero_grad_passes_set_to_none_through():
    acc = Accelerator()
    model, optimizer, _ = acc.prepare(*objects())
    step_loss(model).backward()
    optimizer.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    optimizer.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_optimizer_wrapper_mirrors_the_wrapped_optimizer():
    acc = Accelerator()
    model, optimizer, _ = objects()
    prepared = acc.prepare(optimizer)
    assert prepared.param_groups is optimizer.param_groups and prepared.defaults is optimizer.defaults
    extra = torch.nn.Parameter(torch.zeros(1))
    prepared.add_param_group({"params": [extra]})
    assert optimizer.param_groups[-1]["params"] == [extra]
    assert prepared.state_dict()["param_groups"] == optimizer.state_dict()["param_groups"]
    prepared.train()
    prepared.eval()  # SGD has no modes: nothing happens


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")
def test_scheduler_without_adjustment_still_steps_only_with_updates():
    """HF 1.15: ``adjust_scheduler=False`` changes nothing (tests/test_switching_behaviour.py compares it with HF)."""
    plugin = GradientAccumulationPlugin(num_steps=2, adjust_scheduler=False)
    acc = Accelerator(gradient_accumulation_plugin=plugin)
    model, optimizer, scheduler = acc.prepare(*objects())
    rates = []
    for _ in range(3):
        with acc.accumulate(model):
            scheduler.step()
            rates.append(scheduler.get_last_lr()[0])
    assert rates == [1.0, 0.5, 0.5]


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")
def test_scheduler_not_stepped_with_optimizer_steps_on_every_call():
    acc = Accelerator(gradient_accumulation_steps=2, step_scheduler_with_optimizer=False)
    model, optimizer, scheduler = acc.prepare(*objects())
    with acc.accumulate(model):
        scheduler.step()
    assert scheduler.get_last_lr() == [0.5]


def test_one_cycle_scheduler_never_steps_past_its_total():
    acc = Accelerator()
    model, optimizer, _ = objects()
    one_cycle = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1.0, total_steps=2)
    optimizer, scheduler = acc.prepare(optimizer, one_cycle)
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    assert one_cycle._step_count == 3, "the count reaches total_steps + 1 (the construction step) and stops"
    assert scheduler.state_dict() == one_cycle.state_dict()
    scheduler.load_state_dict(one_cycle.state_dict())
    assert scheduler.get_last_lr() == one_cycle.get_last_lr()


# -- accumulation ------------------------------------------------------------------------


def test_backward_divides_by_accumulation_steps_and_passes_kwargs():
    acc = Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=4))
    model, twin = linear(), linear()
    (step_loss(twin) / 4).backward()
    loss = step_loss(model)
    acc.backward(loss, retain_graph=True)
    assert torch.allclose(model.weight.grad, twin.weight.grad)
    acc.backward(loss)
    assert torch.allclose(model.weight.grad, 2 * twin.weight.grad)


def _sync_pattern(acc, loader, model, epochs=2) -> list[bool]:
    pattern = []
    for _ in range(epochs):
        for _batch in loader:
            with acc.accumulate(model):
                pattern.append(acc.sync_gradients)
    return pattern


def test_accumulation_syncs_at_the_end_of_the_loader_and_restarts():
    acc = Accelerator(gradient_accumulation_steps=2)
    model, loader = acc.prepare(linear(), torch.utils.data.DataLoader(list(range(3)), batch_size=1))
    assert _sync_pattern(acc, loader, model) == [False, True, True] * 2


def test_accumulation_ignores_the_loader_without_sync_with_dataloader():
    plugin = GradientAccumulationPlugin(num_steps=2, sync_with_dataloader=False)
    acc = Accelerator(gradient_accumulation_plugin=plugin)
    model, loader = acc.prepare(linear(), torch.utils.data.DataLoader(list(range(3)), batch_size=1))
    assert _sync_pattern(acc, loader, model) == [False, True, False, True, False, True]


def test_synchronisation_helpers_are_no_ops_without_ddp():
    acc = Accelerator()
    model = acc.prepare(linear())
    with acc.no_sync(model), acc.trigger_sync_in_backward(model), acc.join_uneven_inputs([model], even_batches=False):
        step_loss(model).backward()
    assert model.weight.grad is not None


# -- clipping and mixed precision --------------------------------------------------------


def test_clip_grad_value_and_norm_without_amp():
    acc = Accelerator()
    model, optimizer, _ = acc.prepare(*objects())
    model.weight.grad = torch.tensor([[3.0, -4.0, 0.5]])
    model.bias.grad = torch.tensor([-2.0])
    acc.clip_grad_value_(model.parameters(), 1.0)
    assert model.weight.grad.tolist() == [[1.0, -1.0, 0.5]] and model.bias.grad.tolist() == [-1.0]
    norm = acc.clip_grad_norm_(model.parameters(), 0.1)
    assert norm.item() == pytest.approx((1 + 1 + 0.25 + 1) ** 0.5)
    assert torch.cat([p.grad.reshape(-1) for p in model.parameters()]).norm().item() == pytest.approx(0.1, rel=1e-4)


def test_bf16_autocasts_forward_and_honours_autocast_kwargs():
    acc = Accelerator(mixed_precision="bf16")
    assert acc.native_amp and acc.scaler is None
    inner = []
    model = torch.nn.Sequential(linear())
    model[0].register_forward_hook(lambda module, args, out: inner.append(out.dtype))
    assert acc.prepare(model)(torch.ones(1, 3)).dtype == torch.float32
    assert inner == [torch.bfloat16]
    with acc.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
        with acc.autocast(AutocastKwargs(enabled=False)):
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32


def test_no_mixed_precision_means_no_autocast():
    acc = Accelerator()
    assert not acc.native_amp and acc.scaler is None
    with acc.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32


def test_fp16_scales_skips_overflowing_steps_and_holds_the_scheduler():
    handler = GradScalerKwargs(init_scale=8.0, backoff_factor=0.25, growth_interval=1000)
    acc = Accelerator(mixed_precision="fp16", kwargs_handlers=[handler])
    assert isinstance(acc.scaler, torch.amp.GradScaler) and acc.scaler.get_scale() == 8.0
    model, optimizer, scheduler = acc.prepare(*objects())
    acc.backward(step_loss(model) * float("inf"))
    before = weights(model)
    optimizer.step()
    scheduler.step()
    assert acc.optimizer_step_was_skipped and weights(model) == before
    assert scheduler.get_last_lr() == [1.0], "no scheduler step for a skipped update"
    assert acc.scaler.get_scale() == 2.0
    optimizer.zero_grad()
    acc.backward(step_loss(model))
    acc.unscale_gradients(optimizer=[optimizer])
    unscaled = model.weight.grad.clone()
    optimizer.step()
    scheduler.step()
    assert not acc.optimizer_step_was_skipped and weights(model) != before
    assert scheduler.get_last_lr() == [0.5]
    assert torch.isfinite(unscaled).all()


def test_clip_grad_norm_unscales_fp16_gradients_first():
    acc = Accelerator(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=1024.0)])
    model, optimizer, _ = acc.prepare(*objects())
    twin = linear()
    with acc.autocast():
        step_loss(twin).backward()
    acc.backward(step_loss(model))
    assert model.weight.grad.norm() > 500 * twin.weight.grad.norm(), "gradients are scaled after backward"
    norm = acc.clip_grad_norm_(model.parameters(), 1e9)
    expected = torch.cat([p.grad.reshape(-1) for p in twin.parameters()]).norm()
    assert norm.item() == pytest.approx(expected.item(), rel=1e-3)


def test_fp8_without_an_engine_names_the_packages(monkeypatch):
    monkeypatch.setattr(state_module, "is_fp8_available", lambda: False)
    with pytest.raises(ValueError, match="requires `transformer_engine` or `MS-AMP` to be installed"):
        Accelerator(mixed_precision="fp8")


def test_fp8_with_an_engine_is_not_driven(monkeypatch):
    monkeypatch.setattr(state_module, "is_fp8_available", lambda: True)
    with pytest.raises(NotImplementedError, match="FP8"):
        Accelerator(mixed_precision="fp8")


# -- memory and profiling ---------------------------------------------------------------


def test_free_memory_forgets_prepared_objects_and_resets_step():
    acc = Accelerator()
    model, optimizer, scheduler = acc.prepare(*objects())
    with acc.accumulate(model):
        pass
    alive = [weakref.ref(x) for x in (model, optimizer, scheduler)]
    model, optimizer, scheduler = acc.free_memory(model, optimizer, scheduler)
    gc.collect()
    assert (model, optimizer, scheduler) == (None, None, None)
    assert [ref() for ref in alive] == [None, None, None]
    assert acc.step == 0 and acc._models == acc._optimizers == acc._schedulers == acc._dataloaders == []
    assert acc.clear() == []


def test_find_executable_batch_size_halves_after_out_of_memory():
    tried = []

    @find_executable_batch_size(starting_batch_size=64)
    def train(batch_size, label):
        tried.append(batch_size)
        if batch_size > 8:
            raise RuntimeError(OOM)
        return label

    assert train("x") == "x" and tried == [64, 32, 16, 8]
    assert train("y") == "y" and tried[-1] == 8, "the size that worked is kept"
    with pytest.raises(TypeError, match=r"Remove this as the decorator already does so: `train\(label=x\)`"):
        train(8, "x")


def test_find_executable_batch_size_custom_reduction_and_limits():
    sizes = iter([5, 0])

    @find_executable_batch_size(starting_batch_size=10, reduce_batch_size_fn=lambda: next(sizes))
    def never_fits(batch_size):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    with pytest.raises(RuntimeError, match="reached zero"):
        never_fits()

    @find_executable_batch_size
    def other_error(batch_size):
        raise RuntimeError("something else", "with two arguments")

    with pytest.raises(RuntimeError, match="something else"):
        other_error()


@pytest.mark.parametrize(
    "error, expected",
    [
        (RuntimeError(OOM), True),
        (RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"), True),
        (RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear"), True),
        (RuntimeError("shape mismatch"), False),
        (ValueError(OOM), False),
    ],
)
def test_should_reduce_batch_size(error, expected):
    assert should_reduce_batch_size(error) is expected


def test_release_memory_returns_a_none_per_object():
    assert release_memory(1, "a", None) == [None, None, None]


def test_profile_writes_a_chrome_trace_and_accepts_an_override(tmp_path):
    acc = Accelerator(kwargs_handlers=[ProfileKwargs(output_trace_dir=str(tmp_path / "trace"))])
    with acc.profile() as prof:
        torch.ones(4, 4) @ torch.ones(4, 4)
    assert "aten::mm" in {event.key for event in prof.key_averages()}
    trace = json.loads((tmp_path / "trace" / "profile_0.json").read_text())
    assert "traceEvents" in trace
    with acc.profile(ProfileKwargs(activities=["cpu"])) as prof:
        torch.ones(2)
    assert not (tmp_path / "trace" / "profile_1.json").exists()


@pytest.mark.parametrize("factor", [0.5, 0.9])
def test_find_executable_batch_size_reduction_factor_matches_hf_at_0_9(factor, monkeypatch):
    """The keyword expresses both documents: half (v0.27, the catalog) and HF 1.x's 0.9 back-off."""
    # Both implementations collect garbage before every retry: in a pytest process holding the
    # whole suite's objects that took a minute for the 40 retries here, and it decides nothing.
    monkeypatch.setattr(gc, "collect", lambda *args, **kwargs: 0)

    def sizes_tried(decorator):
        tried = []

        @decorator
        def train(batch_size):
            tried.append(batch_size)
            if batch_size > 16:
                raise RuntimeError(OOM)

        train()
        return tried

    ours = sizes_tried(find_executable_batch_size(starting_batch_size=128, reduction_factor=factor))
    if factor == 0.5:
        assert ours == [128, 64, 32, 16]
    else:
        hf_memory = pytest.importorskip("accelerate.utils.memory")
        theirs = sizes_tried(hf_memory.find_executable_batch_size(starting_batch_size=128))
        assert ours == theirs and ours[:3] == [128, 115, 103]
    with pytest.raises(ValueError, match="reduction_factor"):
        find_executable_batch_size(lambda batch_size: None, reduction_factor=1.0)


@pytest.mark.parametrize("distributed_type", ["NO", "MULTI_CPU", "MULTI_GPU", "MULTI_NPU", "XLA"])
def test_accelerator_members_match_hf(distributed_type: str) -> None:
    import accelerate

    import accelerate_ref

    answers = []
    for package, module in zip((accelerate_ref, accelerate), both_states()):
        accelerator = package.Accelerator(cpu=True, dataloader_config=package.DataLoaderConfiguration(non_blocking=True))
        members = [accelerator.non_blocking, accelerator.use_stateful_dataloader, accelerator.should_save_model]
        for state in (module.PartialState(), accelerator.state):  # HF's AcceleratorState keeps its own copy
            state.distributed_type = getattr(module.DistributedType, distributed_type)
            state.num_processes = 1 if distributed_type == "NO" else 2
        members.append(accelerator.multi_device)
        answers.append(members)
        module.AcceleratorState._reset_state(True)
        module.GradientState._reset_state()
    assert answers[0] == answers[1]
    assert answers[0] == [True, False, True, distributed_type in ("MULTI_GPU", "MULTI_NPU")]


@pytest.mark.usefixtures('fresh_accelerate_state')
def test_project_dir_fills_the_project_config(tmp_path) -> None:
    accelerator = Accelerator(cpu=True, project_dir=str(tmp_path),
                              project_config=ProjectConfiguration(automatic_checkpoint_naming=True))
    assert accelerator.project_dir == str(tmp_path)
    assert accelerator.project_configuration.automatic_checkpoint_naming
    assert accelerator.logging_dir == str(tmp_path)


@pytest.mark.usefixtures('fresh_accelerate_state')
def test_gradient_accumulation_steps_can_be_set() -> None:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    accelerator.gradient_accumulation_steps = 4
    assert accelerator.gradient_accumulation_steps == 4 and accelerator.gradient_state.num_steps == 4


@pytest.mark.usefixtures('fresh_accelerate_state')
def test_register_for_checkpointing_error_is_hfs_and_names_the_index() -> None:
    accelerator = Accelerator(cpu=True)
    good = torch.nn.Linear(1, 1)
    with pytest.raises(ValueError, match=r"All `objects` must include a `state_dict` and `load_state_dict`") as error:
        accelerator.register_for_checkpointing(good, object())
    assert "Item at index 0, `object`" in str(error.value)  # HF 1.15 numbers the invalid objects among themselves


@pytest.mark.usefixtures('fresh_accelerate_state')
def test_changing_mixed_precision_after_initialisation_gives_hfs_message() -> None:
    Accelerator(cpu=True)
    with pytest.raises(ValueError, match=r"AcceleratorState has already been initialized and cannot be changed, "
                                         r"restart your runtime completely and pass `mixed_precision='bf16'`"):
        Accelerator(cpu=True, mixed_precision="bf16")


@pytest.mark.usefixtures('fresh_accelerate_state')
def test_v027_keywords_and_a_dataloader_config_together_are_refused() -> None:
    from accelerate_ref import DataLoaderConfiguration

    with pytest.raises(ValueError, match="dataloader_config"):
        Accelerator(cpu=True, even_batches=False, dataloader_config=DataLoaderConfiguration())


@pytest.mark.usefixtures('fresh_accelerate_state')
def test_v027_positional_autocast_cache_enabled() -> None:
    """v0.27's ``autocast(cache_enabled, autocast_handler)``: ``autocast(True)`` still means cache_enabled=True."""
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    outside = torch.is_autocast_cache_enabled()
    torch.set_autocast_cache_enabled(False)
    try:
        with pytest.warns(FutureWarning, match="AutocastKwargs"), accelerator.autocast(True):
            assert torch.is_autocast_cache_enabled()
    finally:
        torch.set_autocast_cache_enabled(outside)


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
def test_accelerator_fp8_backend(fresh_accelerate_state):
    from accelerate_ref import Accelerator

    if not hasattr(Accelerator, "fp8_backend"):
        pytest.skip("Accelerator.fp8_backend is added by the lead at merge time")
    assert Accelerator().fp8_backend == ref_utils.dataclasses.FP8BackendType.NO


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
@pytest.mark.parametrize("mixed_precision", [None, "no", "bf16"])
def test_a_recipe_without_fp8_is_refused_as_hf(fresh_accelerate_state, mixed_precision):
    from accelerate.state import AcceleratorState as HFState

    from accelerate_ref import Accelerator

    errors = []
    for accelerator, recipe in ((Accelerator, ref_utils.MSAMPRecipeKwargs()), (hf_accelerator.Accelerator, hf_utils.MSAMPRecipeKwargs())):
        HFState._reset_state(True)
        with pytest.raises(ValueError) as caught:
            accelerator(mixed_precision=mixed_precision, kwargs_handlers=[recipe])
        errors.append(str(caught.value))
    HFState._reset_state(True)
    assert errors[0] == errors[1]


def test_accelerator_module_exposes_the_bitsandbytes_and_xpu_checks_as_hf():
    """HF's tests patch ``accelerate.accelerator.is_bitsandbytes_multi_backend_available`` and ``is_xpu_available``."""
    import accelerate_ref.accelerator as ref_accelerator

    for name in ("is_bitsandbytes_multi_backend_available", "is_xpu_available"):
        assert getattr(ref_accelerator, name) is getattr(ref_utils.imports, name)
        assert getattr(hf_accelerator, name) is getattr(hf_utils.imports, name)
    assert ref_accelerator.is_bitsandbytes_multi_backend_available() == hf_accelerator.is_bitsandbytes_multi_backend_available()


QUANTIZED_MAPS = [
    ("is_loaded_in_8bit", {"": "cpu"}, False, False),  # HF's test_prepare_model_8bit_cpu_offload_raises_valueerror_not_typeerror
    ("is_loaded_in_8bit", {"": "cpu"}, True, False),
    ("is_loaded_in_4bit", {"": "cpu"}, True, True),
    ("is_loaded_in_4bit", {"": "disk"}, True, False),
    ("is_loaded_in_8bit", {"": 0}, False, False),
    ("is_loaded_in_8bit", {"": 1}, False, False),
    ("is_loaded_in_8bit", {"": "cuda:1"}, True, False),
    ("is_loaded_in_8bit", {"": torch.device("cpu")}, False, False),
    ("is_loaded_in_4bit", {"a": 0, "b": "cpu"}, True, False),
    ("is_loaded_in_4bit", {"a": 0, "b": "disk"}, True, False),
    ("not_quantized", {"": "cpu"}, False, False),
]


@pytest.mark.parametrize(("flag", "device_map", "multi_backend", "xpu"), QUANTIZED_MAPS, ids=[str(case) for case in QUANTIZED_MAPS])
def test_a_quantized_model_with_a_device_map_is_checked_as_hf(flag, device_map, multi_backend, xpu):
    """The 8-bit/4-bit checks go through the accelerator module's names, so patching them there takes effect."""
    from unittest import mock

    import accelerate_ref.accelerator as ref_accelerator

    seen = []
    for module in both_states():
        accelerator_module = hf_accelerator if module.__name__.startswith("accelerate.") else ref_accelerator
        model = linear()
        setattr(model, flag, True)
        model.hf_device_map = device_map
        with (mock.patch.object(accelerator_module, "is_bitsandbytes_multi_backend_available", return_value=multi_backend),
              mock.patch.object(accelerator_module, "is_xpu_available", return_value=xpu)):
            try:
                prepared = accelerator_module.Accelerator(cpu=True).prepare_model(model)
                seen.append(("prepared", prepared is model, str(prepared.weight.device)))
            except (ValueError, RuntimeError) as error:
                seen.append((type(error).__name__, str(error)))
    assert seen[0] == seen[1]
