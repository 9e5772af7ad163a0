"""Catalog section "Training": mixed precision (autocast, its kwargs handler, the fp32 wrapper, the fp16 scaler)."""

from __future__ import annotations

import pickle
from typing import Any

import torch

from ..support.checks import expect_equal, expect_true

from ..support.training import (
    BATCH,
    FEATURES,
    MyModel,
    autocast_dtype,
    case,
    grads_of,
    record_output_dtypes,
    sample_loss,
    sgd_of,
    tiny_linear,
    weights_of,
)


def _matmul_dtype(acc: Any) -> torch.dtype:
    a = torch.ones(2, 2, device=acc.device)
    return (a @ a).dtype


@case("autocast.bf16")
def autocast_bf16(impl, world):
    """``mixed_precision="bf16"``: forwards autocast to bf16 where torch does; ``autocast()`` and ``AutocastKwargs`` work.

    ``autocast(autocast_handler=AutocastKwargs(enabled=False))`` inside an
    autocast block reverts it to fp32, as the document suggests.
    """
    acc = impl.Accelerator(mixed_precision="bf16")
    expect_equal(acc.mixed_precision, "bf16", "accelerator.mixed_precision")
    model = MyModel()
    dtypes = record_output_dtypes(model.linear)
    prepared = acc.prepare(model)
    prepared(torch.ones(2, FEATURES, device=acc.device))
    expect_equal(dtypes, [autocast_dtype(acc, torch.bfloat16)], "dtype of the prepared model's inner Linear output")
    expect_equal(_matmul_dtype(acc), torch.float32, "matmul dtype outside accelerator.autocast()")
    with acc.autocast():
        expect_equal(_matmul_dtype(acc), torch.bfloat16, "matmul dtype inside accelerator.autocast()")
        with acc.autocast(autocast_handler=impl.AutocastKwargs(enabled=False)):
            expect_equal(_matmul_dtype(acc), torch.float32, "matmul dtype inside autocast(AutocastKwargs(enabled=False))")


@case("autocast.bf16")
def autocast_kwargs_handler(impl, world):
    """``AutocastKwargs`` given to the Accelerator applies to ``autocast()`` and to prepared models."""
    acc = impl.Accelerator(mixed_precision="bf16", kwargs_handlers=[impl.AutocastKwargs(enabled=False)])
    with acc.autocast():
        expect_equal(_matmul_dtype(acc), torch.float32, "matmul dtype inside autocast() with AutocastKwargs(enabled=False)")
    model = MyModel()
    dtypes = record_output_dtypes(model.linear)
    acc.prepare(model)(torch.ones(2, FEATURES, device=acc.device))
    expect_equal(dtypes, [torch.float32], "inner Linear output dtype with AutocastKwargs(enabled=False)")


@case("unwrap.keep_fp32_wrapper")
def unwrap_keep_fp32_wrapper(impl, world):
    """``unwrap_model(model, keep_fp32_wrapper=False)`` removes the mixed-precision forward wrapper.

    Under ``mixed_precision="bf16"`` the unwrapped model keeps autocasting
    by default (its inner Linear computes in bf16); with
    ``keep_fp32_wrapper=False`` its forward is the user's again: fp32
    inside, and the model pickles and reloads.
    """
    acc = impl.Accelerator(mixed_precision="bf16")
    model = MyModel()
    dtypes = record_output_dtypes(model.linear)
    prepared = acc.prepare(model)
    x = torch.ones(2, FEATURES, device=acc.device)
    acc.unwrap_model(prepared)(x)
    expect_equal(dtypes, [autocast_dtype(acc, torch.bfloat16)], "inner Linear dtype with the wrapper kept (default)")
    bare = acc.unwrap_model(prepared, keep_fp32_wrapper=False)
    expect_true(bare is model, "unwrap_model(..., keep_fp32_wrapper=False) should return the user's model")
    dtypes.clear()
    out = bare(x)
    expect_equal([dtypes, out.dtype], [[torch.float32], torch.float32], "inner and output dtypes without the wrapper")
    reloaded = pickle.loads(pickle.dumps(bare))
    expect_equal(weights_of(reloaded), weights_of(model), "weights of the model pickled after unwrapping")


@case("autocast.fp16_scaler")
def autocast_fp16_scaler(impl, world):
    """``mixed_precision="fp16"`` scales the loss with a GradScaler configured by ``GradScalerKwargs``; overflow skips a step.

    Erratum: the utilities reference writes ``GradScalerKwargs(backoff_filter=0.25)``;
    the field is ``backoff_factor``. Gradients after backward are the true
    ones times the scale: ``init_scale`` first, ``init_scale *
    backoff_factor`` after the overflowing step, whose update is skipped
    (weights unchanged, ``optimizer_step_was_skipped`` True). Every rank
    trains on the same samples, so synchronised gradients are one process's.
    """
    handler = impl.GradScalerKwargs(init_scale=1024.0, backoff_factor=0.25, growth_interval=1000)
    acc = impl.Accelerator(mixed_precision="fp16", kwargs_handlers=[handler])
    model = tiny_linear()
    model, optimizer = acc.prepare(model, sgd_of(model))
    indices = list(range(BATCH))

    def scale_seen() -> float:
        """Ratio of the gradients after accelerator.backward to the true ones (twin at the same weights)."""
        twin = tiny_linear()
        torch.nn.utils.vector_to_parameters(torch.tensor(weights_of(acc.unwrap_model(model))), twin.parameters())
        twin = twin.to(acc.device)  # set on the host: XLA parameters take no host data (set_data)
        with acc.autocast():
            sample_loss(twin, indices, acc.device).backward()
        acc.backward(sample_loss(model, indices, acc.device))
        got, true = torch.tensor(grads_of(acc.unwrap_model(model))), torch.tensor(grads_of(twin))
        return float(got.norm() / true.norm())

    first = scale_seen()
    expect_true(abs(first / 1024.0 - 1) < 1e-2, f"gradients should be scaled by init_scale=1024, scaled by {first:.4g}")
    before = weights_of(acc.unwrap_model(model))
    optimizer.step()
    optimizer.zero_grad()
    expect_true(acc.optimizer_step_was_skipped is False, "optimizer_step_was_skipped after a finite step")
    expect_true(weights_of(acc.unwrap_model(model)) != before, "a finite step should update the weights")

    before = weights_of(acc.unwrap_model(model))
    acc.backward(sample_loss(model, indices, acc.device) * float("inf"))
    optimizer.step()
    optimizer.zero_grad()
    expect_true(acc.optimizer_step_was_skipped is True, "optimizer_step_was_skipped after an overflowing step")
    expect_equal(weights_of(acc.unwrap_model(model)), before, "weights after the skipped (overflowing) step")

    second = scale_seen()
    expect_true(abs(second / 256.0 - 1) < 1e-2, f"after overflow the scale should be 1024 * backoff_factor 0.25 = 256, got {second:.4g}")
    optimizer.step()
    expect_true(acc.optimizer_step_was_skipped is False, "optimizer_step_was_skipped after the next finite step")
