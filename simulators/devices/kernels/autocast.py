"""``torch.autocast`` on the mock devices: torch's autocast rules, applied from Python.

torch registers autocast kernels in C++ for its own backends only, so a
PrivateUse1 backend written in Python must bring its own. Rules (those of
torch's CUDA autocast, catalog ``autocast.bf16``, ``autocast.fp16_scaler``):

- inside ``torch.autocast(<device>, dtype)``, the matrix products and
  convolutions (`LOWER_PRECISION`) run in ``dtype`` (their floating inputs
  are cast to it), the precision-sensitive ops (`FULL_PRECISION`: losses,
  softmax, norms, exp/log, reductions) run in float32, and every other op
  runs on its inputs as they are; float64 inputs are never cast;
- the casts happen above autograd, so gradients flow back through them in
  the parameters' own dtype;
- outside an autocast region nothing changes (torch skips the key);
- the cast cache (``cached_cast`` in torch's ``autocast_mode.cpp``): a float32 leaf that requires grad and
  is no view (a parameter) is cast to the lower-precision dtype once per autocast region and thread, and the
  copy is kept until the outermost region of the thread exits (``torch.clear_autocast_cache``), unless the
  region was entered with ``cache_enabled=False``. On a GPU the copies stay on the device that long (real
  H200 snapshot ``../shared/gpu/mlp_bf16.pickle``: the MLP's two bf16 weights, 33,554,432 bytes each, cast
  once for both steps of the region), so they count in the memory books.

:func:`install` registers the rules for PrivateUse1 and makes ``aliases``
(``xla``, whose device type is torch's own) turn PrivateUse1's autocast on
and off with them.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_map

LOWER_PRECISION = frozenset({
    "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "convolution", "_convolution", "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linear",
    "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "scaled_dot_product_attention",
    "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
})
FULL_PRECISION = frozenset({
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow", "softplus", "layer_norm", "native_layer_norm", "group_norm", "frobenius_norm",
    "nuclear_norm", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "softmax", "log_softmax", "cross_entropy_loss", "cumprod", "cumsum", "prod", "sum", "linalg_vector_norm",
})
_KEY = torch._C.DispatchKey.AutocastPrivateUse1
_libraries: list[torch.library.Library] = []


def install(aliases: tuple[str, ...] = ()) -> None:
    """Apply the rules to PrivateUse1 tensors; ``torch.autocast(alias)`` also switches them on.

    Every overload of the listed ops gets a kernel for the ``AutocastPrivateUse1``
    key (torch calls a Python fallback only for tensors without a Python
    subclass); every other op falls through.
    """
    library = torch.library.Library("_", "IMPL")
    library.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    per_op = torch.library.Library("aten", "IMPL")
    for names, dtype in ((LOWER_PRECISION, None), (FULL_PRECISION, torch.float32)):
        for name in sorted(names):
            packet = getattr(torch.ops.aten, name, None)
            for overload in packet.overloads() if packet is not None else ():
                op = getattr(packet, overload)
                per_op.impl(op._schema.name.split("::")[-1] + ("" if overload == "default" else f".{overload}"),
                            _autocasting(op, dtype), "AutocastPrivateUse1")
    _libraries.extend([library, per_op])
    torch.clear_autocast_cache = _clearing_casts(torch.clear_autocast_cache)
    if aliases:
        _mirror(aliases)


def _autocasting(op: Any, dtype: torch.dtype | None) -> Callable[..., Any]:
    """A kernel running ``op`` with its floating inputs cast to ``dtype`` (None: the autocast dtype)."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(_KEY)):
            args, kwargs = _cast((args, kwargs), dtype or torch.get_autocast_dtype(_hidden_name()))
            return op(*args, **kwargs)

    return kernel


def _cast(values: Any, dtype: torch.dtype) -> Any:
    def cast(value: Any) -> Any:
        eligible = isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.float64
        if not eligible or value.dtype == dtype:
            return value
        if not _cacheable(value, dtype):
            return value.to(dtype)
        cache = _cache()
        cached = cache.get(id(value))
        if cached is None or cached[0]() is not value:
            cached = cache[id(value)] = (weakref.ref(value), value.to(dtype))
        return cached[1]

    return tree_map(cast, values)


def _cacheable(value: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether torch's cast cache keeps ``value``'s cast to ``dtype`` (see the module docstring)."""
    return (dtype == torch.get_autocast_dtype(_hidden_name()) and value.dtype == torch.float32
            and value.requires_grad and value.is_leaf and not value._is_view() and torch.is_autocast_cache_enabled())


#: Per thread, the casts kept in the current outermost autocast region: id of the original -> (weak reference to it, its cast).
_casts = threading.local()


def _cache() -> dict[int, tuple[weakref.ref, torch.Tensor]]:
    if not hasattr(_casts, "by_id"):
        _casts.by_id = {}
    return _casts.by_id


def _clearing_casts(clear: Callable[[], None]) -> Callable[[], None]:
    """``torch.clear_autocast_cache`` (what the outermost ``torch.autocast`` exit calls), clearing this thread's casts too."""

    def cleared() -> None:
        clear()
        _cache().clear()

    cleared.__doc__ = clear.__doc__
    return cleared


def _hidden_name() -> str:
    return torch._C._get_privateuse1_backend_name()


def _mirror(aliases: tuple[str, ...]) -> None:
    """Make ``torch.set_autocast_enabled/dtype(alias, ...)`` (what ``torch.autocast`` calls) set PrivateUse1's too."""

    def mirrored(setter: Callable[..., None]) -> Callable[..., None]:
        def set_for(*args: Any) -> None:
            setter(*args)
            if len(args) == 2 and args[0] in aliases:
                setter(_hidden_name(), args[1])

        set_for.__doc__ = setter.__doc__
        return set_for

    torch.set_autocast_enabled = mirrored(torch.set_autocast_enabled)
    torch.set_autocast_dtype = mirrored(torch.set_autocast_dtype)
