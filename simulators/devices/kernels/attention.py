"""``scaled_dot_product_attention`` on the mock GPU keeps what the GPU's fused kernel keeps, not the CPU's math.

A CPU run of ``torch.nn.functional.scaled_dot_product_attention`` with dropout (``nn.MultiheadAttention``
in training) takes torch's math path, which materialises the attention matrix, its softmax and the
dropout mask and keeps them for backward. A GPU picks a fused kernel instead (torch's
``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``: flash attention or cuDNN attention for fp16/bf16
on compute capability 8.0 and up, memory-efficient attention for every floating dtype from 5.0) which
keeps for backward only the output and the row-wise log-sum-exp, in float32 (real H200 snapshots
``../shared/gpu/encoder.pickle``: ``_efficient_attention_forward`` allocates the output, 4,194,304 bytes,
and the log-sum-exp, 65,536 bytes, per layer; ``encoder_bf16.pickle``: ``run_cudnn_SDP_fprop`` the same
for bf16). Rules, for inputs on the mock GPU where a fused kernel is enabled
(``torch.backends.cuda.*_sdp_enabled``, ``torch.nn.attention.sdpa_kernel``) and the dtype is not float64:

- forward: the output, computed from the payloads (no intermediate is on the device; bf16 and fp16 in float32,
  rounded once, as :mod:`simulators.devices.kernels.lowp_matmul` computes products), and a float32
  log-sum-exp of ``query.shape[:-1]``, its last dimension padded to a multiple of 32 where
  memory-efficient attention runs (float32, or an attention mask, or before compute capability 8.0);
- backward: the gradients, recomputed from the payloads with the forward's random state, so dropout drops
  the same elements, then the kernel's workspace while it runs: a float32 accumulator of the query's size
  and a float32 row sum per query;
- no-compute mode (meta payloads): the same tensors, nothing computed (the output's shape is the query's rows
  by the value's features, each gradient its input's), so an attention mask made of kept values
  (:func:`simulators.devices.no_compute.meta_payloads.payload_device_for`) is never read.
"""
from __future__ import annotations

import warnings
from typing import Any

import torch

from simulators.devices.kernels import flash_attention
from simulators.devices.families import machine
from simulators.devices.kernels.lowp_matmul import LOW_PRECISION
from simulators.devices.families.tensor import _payload_of

#: Rows of the memory-efficient kernel's log-sum-exp are padded to a multiple of this (``kAlignLSE``).
LSE_ALIGNMENT = 32


_libraries: list[torch.library.Library] = []


def install(tensor_class: type) -> None:
    """Run ``aten::scaled_dot_product_attention`` on ``tensor_class``'s tensors as the GPU does (the rules above).

    The kernel is registered for PrivateUse1's autograd key, ahead of torch's composite one, which a
    Python-level hook would miss where a library calls it under its own ``__torch_function__`` handling
    (``nn.MultiheadAttention``)."""
    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # "Overriding a previously registered kernel": torch's composite one, meant
        warnings.simplefilter("ignore")
        library.impl("scaled_dot_product_attention", _kernel(tensor_class), "AutogradPrivateUse1")
    _libraries.append(library)


def fused(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, tensor_class: type) -> bool:
    """Whether attention over these inputs runs a fused kernel on the simulated GPU."""
    backends = torch.backends.cuda
    return (all(type(tensor) is tensor_class for tensor in (query, key, value)) and query.dtype != torch.float64
            and (backends.flash_sdp_enabled() or backends.mem_efficient_sdp_enabled() or backends.cudnn_sdp_enabled()))


def _kernel(tensor_class: type) -> Any:
    def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                     attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                                     is_causal: bool = False, scale: float | None = None,
                                     enable_gqa: bool = False) -> torch.Tensor:
        if fused(query, key, value, tensor_class):
            return _FusedAttention.apply(query, key, value, attn_mask, (dropout_p, is_causal, scale, enable_gqa))
        if type(query) is not tensor_class and flash_attention.flash_eligible(query, key, attn_mask):
            # DTensors (context parallelism): the fused op by name, which their dispatch runs as ring attention
            return torch.ops.aten._scaled_dot_product_flash_attention(
                query, key, value, dropout_p, is_causal, scale=scale)[0]
        return torch.ops.aten._scaled_dot_product_attention_math(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)[0]

    return scaled_dot_product_attention


def _log_sum_exp_rows(query: torch.Tensor, masked: bool) -> int:
    rows = query.shape[-2]
    flash = (query.dtype in (torch.float16, torch.bfloat16) and not masked and machine.gpu_capability() >= (8, 0)
             and query.shape[-1] <= 256)
    return rows if flash else -(-rows // LSE_ALIGNMENT) * LSE_ALIGNMENT


def _payload(value: Any) -> Any:
    """The payload of a mock tensor, widened to float32 where it is bf16 or fp16 with values: a GPU's attention
    accumulates in float32 and rounds its results once (:mod:`simulators.devices.kernels.lowp_matmul`'s rule)."""
    payload = _payload_of(value)
    if isinstance(payload, torch.Tensor) and payload.dtype in LOW_PRECISION and not payload.is_meta:
        return payload.float()
    return payload


def _fresh(result: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``result`` in ``dtype`` on a storage of its own laid out as the GPU's kernels write their outputs and
    gradients: (batch, sequence, heads, features) in memory, seen as (batch, heads, sequence, features), so that
    a script's ``transpose(1, 2).contiguous()`` copies nothing, as on the GPU (torch's meta kernels give the other
    layout; the CPU's kernels give this one)."""
    if result.dim() != 4:
        return torch.empty_like(result, dtype=dtype) if result.is_meta else result.to(dtype)
    batch, heads, length, features = result.shape
    laid_out = torch.empty((batch, length, heads, features), dtype=dtype, device=result.device).transpose(1, 2)
    return laid_out if result.is_meta else laid_out.copy_(result)


def _backward_workspace(query: torch.Tensor) -> None:
    """What the backward kernel takes after its gradients and frees before it returns: a float32 accumulator of
    the query's gradient and a float32 row sum per query (FlashAttention-2's ``dq_accum`` and ``softmax_d``;
    ``encoder_bf16.pickle``: cuDNN's backward, one 4,260,096-byte workspace after the three 2 MiB gradients)."""
    accumulator = torch.empty(query.shape, dtype=torch.float32, device=query.device)
    row_sums = torch.empty(query.shape[:-1], dtype=torch.float32, device=query.device)
    del accumulator, row_sums


class _FusedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Any,
                options: tuple) -> torch.Tensor:
        dropout_p, is_causal, scale, enable_gqa = options
        ctx.rng_state = torch.get_rng_state()
        if _payload_of(query).is_meta:  # no-compute mode: the kernel's output, (..., query rows, value features)
            out = _payload_of(query).new_empty((*query.shape[:-1], value.shape[-1]))
        else:
            with torch.no_grad():
                out = torch.nn.functional.scaled_dot_product_attention(
                    _payload(query), _payload(key), _payload(value), _payload(attn_mask), dropout_p, is_causal,
                    scale=scale, enable_gqa=enable_gqa)
        output = type(query).wrap(_fresh(out, query.dtype), query.device_index, checked=True)
        shape = (*query.shape[:-2], _log_sum_exp_rows(query, attn_mask is not None))
        log_sum_exp = torch.empty(shape, dtype=torch.float32, device=query.device)
        ctx.options = options
        ctx.save_for_backward(query, key, value, attn_mask, output, log_sum_exp)
        return output

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        query, key, value, attn_mask, _output, _log_sum_exp = ctx.saved_tensors
        inputs = [_payload(tensor).detach().requires_grad_(tensor.requires_grad) for tensor in (query, key, value)]
        grads = iter(_gradients(ctx, inputs, attn_mask, grad))
        gradients = tuple(type(query).wrap(_fresh(next(grads), tensor.dtype), query.device_index, checked=True)
                          if payload.requires_grad else None for payload, tensor in zip(inputs, (query, key, value)))
        _backward_workspace(query)
        return (*gradients, None, None)


def _gradients(ctx: Any, inputs: list[torch.Tensor], attn_mask: Any, grad: torch.Tensor) -> list:
    """The gradients of the ``inputs`` (the query's, key's and value's payloads) that require one, recomputed with the
    forward's random state; in no-compute mode (meta payloads) the inputs' shapes only, which :func:`_fresh` lays out
    anew."""
    wanted = [payload for payload in inputs if payload.requires_grad]
    if inputs[0].is_meta:
        return wanted
    dropout_p, is_causal, scale, enable_gqa = ctx.options
    with torch.random.fork_rng(devices=[]), torch.enable_grad():
        torch.set_rng_state(ctx.rng_state)
        out = torch.nn.functional.scaled_dot_product_attention(
            *inputs, _payload(attn_mask), dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        return list(torch.autograd.grad(out, wanted, _payload(grad)))


__all__ = ["LSE_ALIGNMENT", "install", "fused"]
