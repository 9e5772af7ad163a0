"""bf16 and fp16 matrix products on a mock device's CPU payloads, computed as a GPU computes them.

Rule: a GPU's bf16/fp16 matmul accumulates in fp32 and rounds once. So on the mock, a matrix product,
convolution or attention op (`OPS`, and their backward ops) whose floating inputs are bf16 or fp16 runs on
float32 copies of them and each floating result is rounded once (round to nearest even) to the dtype the op
gives for the inputs it was given: ``mm(a, b)`` of two bf16 payloads is ``(a.float() @ b.float()).bfloat16()``
exactly, a bf16 tensor. Besides being closer to the GPU's numbers than the CPU's own bf16 kernels (which round
partial sums on the way), it is fast: a CPU without bf16 matrix instructions takes several to tens of times
longer (by shape) for a bf16 product than for an fp32 one (``benchmarks/dry_run_cost.py`` times a bf16 training
step's dry run against the script run in fp32 on the CPU).

What the script sees is unchanged: the results are payloads of the dtype the op gives (the memory books count
their bytes at that dtype), and the float32 copies and results are temporaries of the payload computation, plain
CPU tensors no mock tensor wraps, which no book counts. The dtype each result takes is what the op's meta kernel
says for the same arguments (asked once per op and argument dtypes). The rule applies when the op's floating
inputs are all of one low-precision dtype (besides the float32 log-sum-exp attention's backward takes): a mix
(``mm`` of a bf16 and an fp32 matrix), like an op with no meta kernel or arguments its meta kernel refuses, runs
as given, so the op raises as it would. In-place and ``out=`` overloads run as given. Attention that reaches the
payloads as an op (the CPU's flash kernel and its backward, on the mock devices whose attention is
``backend._attention_as_on_cpu``) is one op here: the whole of it runs in float32, its outputs rounded once (a
GPU's fused kernel also rounds its probabilities before the second product; the last bits differ either way).
The mock GPU's fused attention (:mod:`simulators.devices.kernels.attention`) computes on the payloads itself, by the
same rule.

A product with an ``out_dtype`` (``OUT_DTYPE_OPS``, CUDA-only kernels in torch) is the plain product of float32
copies rounded once to that dtype. Applied by :meth:`simulators.devices.families.tensor.DeviceTensor.__torch_dispatch__` to
payloads with values; no-compute
mode (meta payloads) computes nothing and is left alone.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch

#: The dtypes a GPU's matrix units take and accumulate in fp32.
LOW_PRECISION = (torch.bfloat16, torch.float16)
#: The ops (every overload that neither mutates nor aliases) computed by the rule, as they reach the payloads:
#: the products and convolutions autocast lowers (``linear`` and ``matmul`` reach them as ``mm``, ``addmm``,
#: ``bmm``), their backward ops, and attention where it reaches the payloads as an op.
NAMES = (
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "matmul", "linear",
    "convolution", "_convolution", "convolution_backward",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_attention_math",
    "_scaled_dot_product_fused_attention_overrideable", "_scaled_dot_product_fused_attention_overrideable_backward",
)


def _overloads(names: tuple[str, ...]) -> frozenset:
    found = set()
    for name in names:
        packet = getattr(torch.ops.aten, name, None)
        for overload in packet.overloads() if packet is not None else ():
            op = getattr(packet, overload)
            schema = op._schema
            if not any(item.alias_info is not None for item in (*schema.arguments, *schema.returns)):
                found.add(op)
    return frozenset(found)


OPS = _overloads(NAMES)
#: Inputs that stay float32 beside low-precision ones, by argument name (attention's backward takes the log-sum-exp
#: its forward gave in float32).
FLOAT32_INPUTS = frozenset({"logsumexp"})
#: (op, its arguments' dtypes and other values) -> the dtype of each of its results (None: run the op as given).
_RESULT_DTYPES: dict[tuple, tuple | None] = {}


#: The products with an ``out_dtype`` (``torch.addmm(acc, a, b, out_dtype=torch.float32)``: a bf16 product kept in
#: fp32, as TRL's chunked log-probabilities accumulate), which torch has for CUDA only.
OUT_DTYPE_OPS = frozenset(getattr(getattr(torch.ops.aten, name), overload)
                          for name in ("mm", "addmm", "bmm", "baddbmm") for overload in ("dtype", "dtype_out"))


def run(func: Any, args: tuple, kwargs: dict) -> Any:
    """``func(*args, **kwargs)`` on CPU payloads, with the rule for the low-precision matrix ops (module docstring)."""
    if func in OUT_DTYPE_OPS:
        return _with_out_dtype(func, args, kwargs)
    if func not in OPS:
        return func(*args, **kwargs)
    dtype = _low_precision(func, args, kwargs)
    if dtype is None:
        return func(*args, **kwargs)
    leaves = _leaves((args, kwargs))
    dtypes = _result_dtypes(func, args, kwargs, leaves)
    if dtypes is None:
        return func(*args, **kwargs)
    out = func(*_map(_widened, args), **_map(_widened, kwargs))
    rounding = iter(dtypes)
    out = _map(lambda value: _rounded(value, next(rounding)), out)
    if next(rounding, _END) is not _END:
        raise AssertionError(f"{func}: more results in its meta kernel's answer than in its own")
    return out


def _with_out_dtype(func: Any, args: tuple, kwargs: dict) -> Any:
    """An ``out_dtype`` product as a GPU runs it: the plain product of float32 copies, rounded once to
    ``out_dtype`` (into ``out`` for the ``dtype_out`` overload)."""
    names = [argument.name for argument in func._schema.arguments]
    given = {**dict(zip(names, args)), **kwargs}
    out_dtype, out = given.pop("out_dtype"), given.pop("out", None)
    plain = getattr(torch.ops.aten, func._schema.name.split("::")[1]).default
    result = plain(**_map(_widened, given)).to(out_dtype)
    return result if out is None else out.copy_(result)


def _low_precision(func: Any, args: tuple, kwargs: dict) -> torch.dtype | None:
    """The one low-precision dtype of ``func``'s floating tensor inputs (besides `FLOAT32_INPUTS`), or None when
    they are not all of one such dtype (the op then runs as given, and refuses a mix as it would)."""
    exempt = _exempt_positions(func)
    found = None
    for position, value in (*enumerate(args), *kwargs.items()):
        if position in exempt:
            continue
        for leaf in _leaves(value):
            if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
                if leaf.dtype not in LOW_PRECISION or found not in (None, leaf.dtype):
                    return None
                found = leaf.dtype
    return found


@functools.cache
def _exempt_positions(func: Any) -> frozenset:
    """The positions and names of ``func``'s `FLOAT32_INPUTS`."""
    arguments = func._schema.arguments
    return frozenset(
        key for index, argument in enumerate(arguments) if argument.name in FLOAT32_INPUTS
        for key in (index, argument.name)
    )


def _widened(value: Any) -> Any:
    return value.float() if isinstance(value, torch.Tensor) and value.dtype in LOW_PRECISION else value


def _rounded(value: Any, dtype: torch.dtype | None) -> Any:
    return value.to(dtype) if isinstance(value, torch.Tensor) and value.dtype != dtype else value


def _result_dtypes(func: Any, args: tuple, kwargs: dict, leaves: list) -> tuple | None:
    """The dtype of each result of ``func`` for these arguments (None for a result that is no tensor), as its
    meta kernel says; None when the op refuses the arguments or has no meta kernel."""
    key = (func, *(leaf.dtype if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves))
    try:
        return _RESULT_DTYPES[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable argument: asked each time
        key = None
    try:
        out = func(*_map(_on_meta, args), **_map(_on_meta, kwargs))
        dtypes = tuple(value.dtype if isinstance(value, torch.Tensor) else None for value in _leaves(out))
    except NotImplementedError:  # no meta kernel: the op runs as given
        dtypes = None
    except Exception:  # noqa: BLE001 - these arguments refused (shapes): the op itself raises as it would
        return None
    if key is not None:
        _RESULT_DTYPES[key] = dtypes
    return dtypes


def _on_meta(value: Any) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")


_END = object()


def _leaves(value: Any) -> list[Any]:
    """The leaves of an op's arguments or results (tuples, lists and dicts of them), in order."""
    if type(value) in (tuple, list):
        return [leaf for item in value for leaf in _leaves(item)]
    if type(value) is dict:
        return [leaf for item in value.values() for leaf in _leaves(item)]
    return [value]


def _map(function: Callable[[Any], Any], value: Any) -> Any:
    """``function`` applied to the leaves of ``value`` (see `_leaves`), in the same order."""
    if type(value) in (tuple, list):
        return type(value)(_map(function, item) for item in value)
    if type(value) is dict:
        return {key: _map(function, item) for key, item in value.items()}
    return function(value)
