"""FlashAttention's own ops on mock GPU tensors, for the code that calls them by name: torch's context parallelism.

A script's ``scaled_dot_product_attention`` on mock GPU tensors runs :mod:`simulators.devices.kernels.attention`'s kernel.
Context parallelism (``torch.distributed.tensor.experimental.context_parallel``, HF accelerate's
``maybe_context_parallel``) instead hands the call DTensors sharded along the sequence: on a GPU, the composite op
picks a fused backend and calls ``aten._scaled_dot_product_flash_attention`` on them, whose DTensor handler runs
ring attention, calling the same op (and its backward) on each rank's shards and merging the blocks by their
log-sum-exp. Rules:

- the composite on tensors of another subclass (DTensors) calls the flash op where a GPU's backend choice
  (``sdp_utils.cpp``) takes flash attention: fp16 or bf16 inputs, no mask, compute capability 8.0 or more, a head
  size of at most 256; anything else keeps the math path (:func:`flash_eligible`);
- on mock payloads with values, ``aten._scaled_dot_product_flash_attention`` and its backward run torch's CPU flash
  kernels (``_scaled_dot_product_flash_attention_for_cpu`` and its backward) in float32, rounded once to the inputs'
  dtype, as the mock's other attention; the results take the shapes, strides and dtypes of the ops' meta kernels,
  and the random-state tensors (philox seed and offset) are zeros, the debug mask empty;
- without values (no-compute mode) the meta kernels answer, as for every op.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from simulators.devices.families import machine
from simulators.devices.kernels.lowp_matmul import LOW_PRECISION

aten = torch.ops.aten
FLASH = aten._scaled_dot_product_flash_attention.default
FLASH_BACKWARD = aten._scaled_dot_product_flash_attention_backward.default
#: FlashAttention's largest head size (``check_head_dim_size_flash``).
MAX_HEAD_SIZE = 256


def flash_eligible(query: torch.Tensor, key: torch.Tensor, attn_mask: Any) -> bool:
    """Whether a GPU's ``scaled_dot_product_attention`` takes FlashAttention for these inputs (as many key heads as
    query heads: the composite repeats grouped ones only on the math path)."""
    return (query.dtype in LOW_PRECISION and attn_mask is None and machine.gpu_capability() >= (8, 0)
            and query.shape[-1] <= MAX_HEAD_SIZE and query.shape[-3] == key.shape[-3])


def _forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float = 0.0,
             is_causal: bool = False, return_debug_mask: bool = False, *, scale: float | None = None) -> tuple:
    shapes = FLASH(*(_meta(t) for t in (query, key, value)), dropout_p, is_causal, return_debug_mask, scale=scale)
    output, log_sum_exp = aten._scaled_dot_product_flash_attention_for_cpu(
        query.float(), key.float(), value.float(), dropout_p, is_causal, scale=scale)
    return (_like(shapes[0], output), _like(shapes[1], log_sum_exp), *(_like(item, None) for item in shapes[2:]))


def _backward(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, out: torch.Tensor,
              logsumexp: torch.Tensor, cum_seq_q: Any, cum_seq_k: Any, max_q: int, max_k: int, dropout_p: float,
              is_causal: bool, philox_seed: Any, philox_offset: Any, *, scale: float | None = None) -> tuple:
    grads = aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out.float(), query.float(), key.float(), value.float(), out.float(), logsumexp, dropout_p, is_causal,
        scale=scale)
    return tuple(_like(_meta(like), grad) for like, grad in zip((query, key, value), grads))


def _meta(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="meta")


def _like(shape: Any, values: torch.Tensor | None) -> Any:
    """A CPU tensor laid out as ``shape`` (a meta result) holding ``values`` rounded to its dtype, zeros without."""
    if not isinstance(shape, torch.Tensor):
        return shape
    result = torch.empty_strided(shape.shape, shape.stride(), dtype=shape.dtype)
    return result.zero_() if values is None else result.copy_(values)


#: The ops run on CPU payloads by another kernel (:data:`simulators.devices.families.tensor.PAYLOAD_KERNELS`).
PAYLOAD_KERNELS: dict[Any, Callable[..., Any]] = {FLASH: _forward, FLASH_BACKWARD: _backward}

__all__ = ["FLASH", "FLASH_BACKWARD", "MAX_HEAD_SIZE", "PAYLOAD_KERNELS", "flash_eligible"]
