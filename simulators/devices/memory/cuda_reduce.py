"""The staging buffer torch's CUDA reduction kernel takes when it splits one output's inputs across blocks.

``gpu_reduce_kernel`` (torch's ``aten/src/ATen/native/cuda/Reduce.cuh``, which the CPU build ships among its
headers) picks a launch configuration in ``setReduceConfig``. When each output has many inputs and there are
few outputs, it spreads one output's inputs over ``ctas_per_output`` blocks and combines their partial results
through global memory: a staging buffer of ``global_memory_size()`` bytes and ``semaphore_size()`` bytes of
semaphores, both taken from torch's caching allocator after the output and freed when the kernel returns. A
CPU run allocates neither. The usual case is a bias gradient: ``Linear``'s backward sums the output gradient
over every token, so a 2048-token batch gives each of a 512-wide bias's outputs 2048 inputs, and the buffer is
``4 x 512 x 32 blocks x 32 threads x 4 outputs per thread`` = 8,388,608 bytes (real H200 snapshots
``../shared/gpu/encoder.pickle`` and ``transformer.pickle``: 8,388,608, 25,165,824 and 33,554,432 bytes for the
512-, 1536- and 2048-wide biases, with 16, 48 and 64 bytes of semaphores; ``encoder_bf16.pickle``: 131,072,000
bytes for the 8000-wide output layer's, the run's largest segment).

:func:`launch_config` follows ``setReduceConfig`` step for step over the iteration space TensorIterator builds
for a reduction (:func:`iteration_space`: reduced dimensions first, the others by stride, adjacent ones
merged), with the simulated GPU's multiprocessors and resident threads
(:func:`simulators.devices.families.machine.gpu_multiprocessors`). Ops and their kernels' template arguments (the
accumulator's size; how many inputs one vectorised load takes):

- ``sum``: the accumulator is float32 for 16-bit floats (``gpu_reduce_kernel<c10::BFloat16, float, 4, 8>`` in
  ``encoder_bf16.pickle``), else the input's type; 8 inputs per load for 16-bit types, else 4;
- ``mean``: ``mean_kernel_impl``'s ``MeanOps``, the same accumulator, 4 inputs per load.

Other reductions (``amax``, ``prod``, ``var``, norms) keep the CPU's allocations. A reduction over more than
2**31 elements, which the GPU splits into 32-bit-indexable pieces, is configured here as one piece.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from simulators.devices.families import machine

#: ``mnt_wrapper<T>::MAX_NUM_THREADS`` (every type but complex double).
MAX_THREADS = 512
#: ``C10_WARP_SIZE`` on NVIDIA GPUs.
WARP_SIZE = 32
#: ``setReduceConfig``'s bounds on the values one thread reduces before a split across blocks (CUDA builds).
MIN_VALUES_PER_THREAD = 16
MAX_VALUES_PER_THREAD = 256
#: Bytes of one semaphore (``sizeof(int)``).
SEMAPHORE_BYTES = 4

#: The reductions modelled: op name -> inputs per vectorised load, by the input's element size.
_INPUTS_PER_LOAD = {"sum": lambda itemsize: 8 if itemsize == 2 else 4, "mean": lambda itemsize: 4}


@dataclass(frozen=True)
class Space:
    """A reduction's iteration space as TensorIterator gives it to the kernel: sizes, and the input's and the
    output's strides in bytes, fastest dimension first, reduced dimensions (output stride 0) in front."""

    shape: tuple[int, ...]
    input_strides: tuple[int, ...]
    output_strides: tuple[int, ...]

    @property
    def reduced(self) -> int:
        """``num_reduce_dims()``: the dimensions the output does not advance along."""
        return sum(1 for stride in self.output_strides if stride == 0)

    @property
    def outputs(self) -> int:
        """``num_output_elements()``."""
        return math.prod(size for size, stride in zip(self.shape, self.output_strides) if stride)


@dataclass
class LaunchConfig:
    """The part of ``ReduceConfig`` that decides the global buffer."""

    outputs: int
    accumulator_bytes: int
    block_width: int = 1
    output_vec_size: int = 1
    ctas_per_output: int = 1
    block_x_reduce: bool = False
    grid_x: int = 1

    @property
    def global_memory_size(self) -> int:
        """``ReduceConfig::global_memory_size()``: 0 unless one output's inputs are split across blocks."""
        if self.ctas_per_output <= 1:
            return 0
        size = self.accumulator_bytes * self.outputs * self.ctas_per_output
        return size if self.block_x_reduce else size * self.block_width * self.output_vec_size

    @property
    def semaphore_size(self) -> int:
        """``ReduceConfig::semaphore_size()``: one int per block column."""
        return SEMAPHORE_BYTES * self.grid_x if self.ctas_per_output > 1 else 0


def iteration_space(shape: Sequence[int], strides: Sequence[int], itemsize: int, dims: Sequence[int],
                    output_itemsize: int) -> Space:
    """TensorIterator's space for reducing a tensor of ``shape`` and ``strides`` (elements) over ``dims``: the
    output is laid out row-major over the kept dimensions, ``reorder_dimensions`` puts reduced dimensions first
    and sorts the rest by stride (output's first, then input's; equal strides: the smaller size first), and
    ``coalesce_dimensions`` merges neighbours every operand steps through contiguously."""
    ndim = len(shape)
    reduced = {dim % ndim for dim in dims} if ndim else set()
    output = [0] * ndim
    step = output_itemsize
    for dim in reversed(range(ndim)):
        if dim not in reduced:
            output[dim] = step
            step *= shape[dim]
    operands = [output, [stride * itemsize for stride in strides]]  # outputs first, as TensorIterator orders them

    def should_swap(dim0: int, dim1: int) -> int:
        for position, stride in enumerate(operands):
            stride0, stride1 = stride[dim0], stride[dim1]
            if position == 0 and (stride0 == 0) != (stride1 == 0):
                return 1 if stride1 == 0 else -1
            if stride0 == 0 or stride1 == 0:
                continue
            if stride0 != stride1:
                return -1 if stride0 < stride1 else 1
            if shape[dim0] > shape[dim1]:
                return 1
        return 0

    permutation = list(reversed(range(ndim)))
    for start in range(1, ndim):
        moving = start
        for before in reversed(range(start)):
            comparison = should_swap(permutation[before], permutation[moving])
            if comparison > 0:
                permutation[before], permutation[moving] = permutation[moving], permutation[before]
                moving = before
            elif comparison < 0:
                break
    sizes = [shape[dim] for dim in permutation]
    ordered = [[stride[dim] for dim in permutation] for stride in operands]
    return _coalesced(sizes, ordered)


def _coalesced(sizes: list[int], operands: list[list[int]]) -> Space:
    if not sizes:
        return Space((), (), ())
    kept = 0
    for dim in range(1, len(sizes)):
        size0, size1 = sizes[kept], sizes[dim]
        mergeable = size0 == 1 or size1 == 1 or all(size0 * stride[kept] == stride[dim] for stride in operands)
        if mergeable:
            if size0 == 1:
                for stride in operands:
                    stride[kept] = stride[dim]
            sizes[kept] *= size1
        else:
            kept += 1
            sizes[kept] = size1
            for stride in operands:
                stride[kept] = stride[dim]
    return Space(tuple(sizes[:kept + 1]), tuple(operands[1][:kept + 1]), tuple(operands[0][:kept + 1]))


def launch_config(space: Space, itemsize: int, accumulator_bytes: int, inputs_per_load: int, input_offset: int = 0,
                  *, multiprocessors: int, threads_per_multiprocessor: int) -> LaunchConfig:
    """``setReduceConfig<arg_t, scalar_t, vt0, input_vec_size>`` for ``space`` (``input_offset``: the input's first
    element's offset in elements from an aligned address, which ``get_output_vec_size`` reads)."""
    numel = math.prod(space.shape)
    outputs = space.outputs
    inputs_per_output = numel // outputs if outputs else 0
    config = LaunchConfig(outputs=outputs, accumulator_bytes=accumulator_bytes)
    if space.shape:
        reduced = space.reduced
        on_fastest = reduced == len(space.shape) or space.input_strides[0] < space.input_strides[reduced]
        dim0, dim1 = (inputs_per_output, outputs) if on_fastest else (outputs, inputs_per_output)
        fastest_stride = space.input_strides[0] if on_fastest else space.input_strides[reduced]
    else:
        reduced, on_fastest, dim0, dim1, fastest_stride = 0, True, 1, 1, itemsize
    if fastest_stride == itemsize:
        if on_fastest and dim0 >= 128 and reduced == 1:
            dim0 //= inputs_per_load
        elif not on_fastest:
            config.output_vec_size = _output_vec_size(space, itemsize, input_offset)
            dim0 //= config.output_vec_size
    width, height = _block(dim0, dim1, MAX_THREADS // config.output_vec_size)
    config.block_width, threads = width, width * height
    step_input = step_output = 1
    if on_fastest:
        config.block_x_reduce, step_input = True, width
    else:
        step_output = width
    values_per_thread = -(-inputs_per_output // step_input)
    split_across_warps = values_per_thread >= min(height * 16, MAX_VALUES_PER_THREAD)
    if split_across_warps:
        step_input *= height
    else:
        step_output *= height
    config.grid_x = -(-(outputs // config.output_vec_size) // step_output)
    target_grid = multiprocessors * (threads_per_multiprocessor // threads)
    values_per_thread = -(-inputs_per_output // step_input)
    if split_across_warps and values_per_thread >= MAX_VALUES_PER_THREAD and config.grid_x <= target_grid:
        config.ctas_per_output = max(min(-(-target_grid // config.grid_x), -(-values_per_thread // MIN_VALUES_PER_THREAD)),
                                     -(-values_per_thread // MAX_VALUES_PER_THREAD))
    return config


def _block(dim0: int, dim1: int, max_threads: int) -> tuple[int, int]:
    """``ReduceConfig::set_block_dimension``: block width along ``dim0`` (at most a warp first), height along ``dim1``."""
    dim0_pow2 = _last_pow2(dim0) if dim0 < max_threads else max_threads
    dim1_pow2 = _last_pow2(dim1) if dim1 < max_threads else max_threads
    width = min(dim0_pow2, WARP_SIZE)
    height = min(dim1_pow2, max_threads // width)
    return min(dim0_pow2, max_threads // height), height


def _last_pow2(value: int) -> int:
    return 1 << (max(value, 1).bit_length() - 1)


def _output_vec_size(space: Space, itemsize: int, input_offset: int) -> int:
    """``get_output_vec_size``: 4 outputs per thread, halved until the input's address, the first kept dimension's
    size and every other dimension's input stride divide by it."""
    size = 4
    kept = space.reduced
    values = [input_offset, space.shape[kept]]
    values += [stride // itemsize for dim, stride in enumerate(space.input_strides) if dim != kept]
    for value in values:
        while value % size:
            size //= 2
    return size


def staging_bytes(name: str, tensor: torch.Tensor, dims: Any, output_dtype: torch.dtype | None) -> tuple[int, int]:
    """The global buffer and semaphores (bytes) the GPU takes to reduce ``tensor`` over ``dims`` (None or empty:
    every dimension) with op ``name``; (0, 0) for a reduction it runs without them or an op not modelled."""
    inputs_per_load = _INPUTS_PER_LOAD.get(name)
    if inputs_per_load is None or not tensor.dtype.is_floating_point or tensor.numel() == 0:
        return 0, 0
    itemsize = tensor.element_size()
    accumulator = 4 if itemsize == 2 else itemsize
    dims = range(tensor.dim()) if dims is None or (not isinstance(dims, int) and len(dims) == 0) else dims
    dims = [dims] if isinstance(dims, int) else list(dims)
    output_itemsize = (output_dtype or tensor.dtype).itemsize
    space = iteration_space(tensor.shape, tensor.stride(), itemsize, dims, output_itemsize)
    config = launch_config(space, itemsize, accumulator, inputs_per_load(itemsize), tensor.storage_offset(),
                           multiprocessors=machine.gpu_multiprocessors(),
                           threads_per_multiprocessor=machine.gpu_threads_per_multiprocessor())
    return config.global_memory_size, config.semaphore_size


def observe(tensor_class: type, func: Any, args: tuple, kwargs: dict) -> None:
    """Before reduction ``func`` runs on a mock GPU tensor: its staging buffer and semaphores, taken and freed
    again (the kernel holds them only while it runs; the GPU takes them after the output, which is small
    whenever they are taken: at most a few outputs per block)."""
    if func._opname not in _INPUTS_PER_LOAD or not args or type(args[0]) is not tensor_class:
        return
    tensor = args[0]
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    sizes = [size for size in staging_bytes(func._opname, tensor, dims, kwargs.get("dtype")) if size]
    held = [torch.empty(size, dtype=torch.uint8, device="meta") for size in sizes]  # freed on return
    for payload in held:
        tensor_class.memory.track(payload, tensor.device_index)


__all__ = ["Space", "LaunchConfig", "iteration_space", "launch_config", "staging_bytes", "observe"]
