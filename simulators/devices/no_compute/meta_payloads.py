"""No-compute mode of the mock devices: tensors carry meta payloads, values are placeholders, collectives are checked.

With ``SIMULATORS_NO_COMPUTE=1`` in a rank's environment (issue 23, item 1):

- a mock tensor's payload is a meta tensor (:func:`payload_device`): every op
  runs its shape, dtype and device rules and computes nothing; random ops
  get no generator (a meta tensor draws nothing). The memory books count a
  meta storage at its size in bytes, as a CPU one, so the peaks are those of
  the same run computing;
- where a script asks for a value (``.item()``, ``bool(t)``, ``.tolist()``, ``.numpy()``,
  a copy to the CPU, ``f"{t}"``) it gets a placeholder: zeros (a copy to the
  CPU is ``torch.zeros((), dtype).expand(shape)``, no host memory), and the
  place is recorded once per user line and kind of request, with a count
  (:func:`record`; the rank's memory report lists them under
  ``"placeholders"``). A line asking more than :data:`RUNAWAY_LIMIT` times
  without an optimizer step in between raises a RuntimeError naming it: a
  loop waiting on a value (a loss threshold) would never end on zeros;
- a small integral or bool tensor the device allocates (at most :data:`KNOWN_BYTES`:
  a factory's, a copy from the host; :func:`payload_device_for`) keeps a CPU payload,
  with values: lengths, counts, indices and positions, which scripts and libraries
  exchange between ranks and shape tensors by (DeepSpeed's Ulysses data loader
  all-gathers each rank's sequence length and reads it with ``.item()``). Ops among
  such tensors compute, and their collectives move the values (gloo), as with
  compute; an op that also takes a meta-payload tensor reads them as meta tensors of
  their shape, and one of them it writes then holds zeros, a placeholder like any
  other (:func:`read_as_meta`);
- an op whose results' sizes depend on values it does not have gets the answer
  of :data:`WITHOUT_VALUES` for it, recorded as a placeholder (:func:`without_values`);
- ``data_ptr()`` of a tensor with a meta payload is its storage record's
  address plus its offset (:func:`pointer`; a meta tensor's own is 0), so
  tensors of different storages still have different pointers;
- a collective on mock tensors runs its Meta kernel (no data moves), after
  the ranks of its group exchange a descriptor (op, dtype, shapes) through
  the group itself, so they still wait for each other (a rank waiting alone
  still hangs where it would, for the dry run's diagnosis) and a rank in
  another op or with other shapes raises a RuntimeError naming each rank's
  op and shapes, in torch's ``Detected mismatch between collectives`` words
  (an all-to-all, gather or scatter may differ in shapes, as torch allows).
  A send pushes its descriptor to the peer, and the Work of a send or
  receive is the descriptor's, so waiting on it waits for the peer; the
  receiver compares the descriptor once it has arrived (at its next
  collective). DDP's check that the ranks have the same parameters is such an
  exchange too (:func:`verifying_params`).
"""
from __future__ import annotations

import functools
import math
import os
import zlib
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_flatten, tree_map

from simulators.devices.memory import peaks
from simulators.devices.no_compute import meta_results
from simulators.devices.families.machine import NO_COMPUTE_ENV

#: How many values one user line may ask for between two optimizer steps.
RUNAWAY_LIMIT = 10_000
#: Bytes of a collective's descriptor (longer text keeps its start and a checksum of the whole).
DESCRIPTOR_BYTES = 256
#: Collectives whose ranks may pass tensors of different shapes (split sizes, a root's lists).
UNEVEN_SHAPES = frozenset({"alltoall_", "alltoall_base_", "gather_", "scatter_"})

_META = torch.device("meta")
_CPU = torch.device("cpu")
#: Per process group (its name), the number of collectives it ran (torch's sequence numbers start at 0).
_sequence: dict[str, int] = {}
#: Receives whose descriptor has not been compared yet: (work, buffer, own descriptor, peer rank).
_pending: list[tuple[Any, torch.Tensor, str, int]] = []
#: Values asked for per user line since the last optimizer step, and that step.
_asked: dict[str, int] = {}
_asked_at_step = [0]


def enabled() -> bool:
    """Whether this rank runs without computing (``SIMULATORS_NO_COMPUTE`` set, not "0")."""
    return os.environ.get(NO_COMPUTE_ENV, "") not in ("", "0")


def payload_device() -> torch.device:
    """The device of new payloads: meta in no-compute mode, else the CPU."""
    return _META if enabled() else _CPU


#: The most bytes of an integral or bool tensor whose values the mock devices keep in no-compute mode.
KNOWN_BYTES = 4096


def payload_device_for(size: Sequence[int], dtype: torch.dtype | None) -> torch.device:
    """The device of a new payload of ``size`` and ``dtype`` (None: the default dtype): the CPU for an integral or
    bool one of at most :data:`KNOWN_BYTES` (its values are kept), else :func:`payload_device`."""
    dtype = dtype or torch.get_default_dtype()
    if dtype.is_floating_point or dtype.is_complex:
        return payload_device()
    return _CPU if math.prod(size) * dtype.itemsize <= KNOWN_BYTES else payload_device()


def read_as_meta(func: Any, payloads: list[torch.Tensor], args: tuple, kwargs: dict) -> tuple[tuple, dict, Callable]:
    """``args`` and ``kwargs`` (an op's payload arguments, among which meta payloads) with the CPU ones of
    ``payloads`` (the mock tensors' payloads that keep values) read as meta tensors of their shape, and what to
    call with the op's results: it zeroes the payloads the op wrote (its schema's written arguments: values it did
    not compute) and gives back a result that is one's meta reading (an in-place op's ``self``) as that payload."""
    known = {id(payload) for payload in payloads if not payload.is_meta}
    readings: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def as_meta(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and id(value) in known:
            reading = value.to(_META)
            readings[id(reading)] = (reading, value)
            return reading
        return value

    meta_args, meta_kwargs = tree_map(as_meta, (args, kwargs))
    names = [argument.name for argument in func._schema.arguments]
    written = [argument.name for argument in func._schema.arguments if argument.alias_info and argument.alias_info.is_write]

    def settle(out: Any) -> Any:
        named = dict(zip(names, meta_args)) | meta_kwargs
        for leaf in tree_flatten([named.get(name) for name in written])[0]:
            if isinstance(leaf, torch.Tensor) and id(leaf) in readings:
                readings[id(leaf)][1].zero_()
        return tree_map(lambda value: readings[id(value)][1] if isinstance(value, torch.Tensor) and id(value) in readings
                        else value, out)

    return meta_args, meta_kwargs, settle


# -- placeholders ------------------------------------------------------------------------------


def _noted(what: str) -> str:
    """Count a placeholder of kind ``what`` at the user line on the stack; that line."""
    at = peaks.user_line() or "?"
    key = (at, what)
    peaks.RECORDER.placeholders[key] = peaks.RECORDER.placeholders.get(key, 0) + 1
    return at


def record(what: str) -> None:
    """Note that the user line on the stack asked for a value (``what``: "item", "cpu copy", ...) and got a
    placeholder; RuntimeError once that line asked :data:`RUNAWAY_LIMIT` times since the last optimizer step."""
    at = _noted(what)
    if _asked_at_step[0] != peaks.RECORDER.completed:
        _asked.clear()
        _asked_at_step[0] = peaks.RECORDER.completed
    _asked[at] = _asked.get(at, 0) + 1
    if _asked[at] > RUNAWAY_LIMIT:
        raise RuntimeError(
            f"simulators no-compute mode: {at} asked for a tensor's value ({what}) more than {RUNAWAY_LIMIT} times "
            "without an optimizer step; values are placeholders (zeros) when nothing is computed, so a loop waiting "
            "on one never ends: bound the run with --steps N (each rank ends after N optimizer steps) or dry-run "
            "without --no-compute"
        )


def scalar(dtype: torch.dtype) -> bool | int | float | complex:
    """The placeholder of ``.item()`` for ``dtype``: a zero of its Python type."""
    if dtype is torch.bool:
        return False
    if dtype.is_complex:
        return 0j
    return 0.0 if dtype.is_floating_point else 0


def host_copy(shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """The placeholder of a copy to the CPU: zeros of ``shape`` and ``dtype`` that take one element of host memory."""
    return torch.zeros((), dtype=dtype, device="cpu").expand(shape)


def cpu_copy(shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """A mock tensor's copy to the CPU: from :func:`simulators.devices.no_compute.lazy_host.threshold` bytes on a lazy host
    tensor (no host memory, and a copy of it, ``pin_memory``'s for one, stays lazy: FSDP2's CPU offload pins each
    shard it moves there), else :func:`host_copy`."""
    from simulators.devices.no_compute import lazy_host

    lazy = lazy_host.large_empty(shape, dtype) if lazy_host.installed() else None
    return lazy if lazy is not None else host_copy(shape, dtype)


def pointer(payload: torch.Tensor) -> int:
    """``data_ptr()`` of a tensor with meta payload ``payload`` (a meta tensor's own is 0): the address of its
    storage's record plus its offset in bytes, so that tensors of different storages have different pointers (HF
    accelerate's FSDP2 preparation maps the optimizer's parameters by them) and views of one storage point into it."""
    return payload.untyped_storage()._cdata + payload.storage_offset() * payload.element_size()


def value_of(func: Any, payload_args: tuple, payload_kwargs: dict) -> tuple[bool, Any]:
    """``(True, placeholder)`` when ``func`` on meta payloads asks for a value (recorded), else ``(False, None)``.

    ``bool(t)`` and ``f"{t}"`` ask through ``.item()`` (``aten._local_scalar_dense``), recorded as "item"."""
    aten = torch.ops.aten
    if func is aten._local_scalar_dense.default:
        record("item")
        return True, scalar(payload_args[0].dtype)
    if func is aten._to_copy.default and torch.device(payload_kwargs.get("device") or _META).type == "cpu":
        record("cpu copy")
        source = payload_args[0]
        return True, cpu_copy(source.shape, payload_kwargs.get("dtype") or source.dtype)
    if func is aten.copy_.default and not payload_args[0].is_meta and payload_args[1].is_meta:
        record("cpu copy")
        return True, payload_args[0].zero_()
    return False, None


def _no_outliers(A: torch.Tensor, threshold: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """bitsandbytes' ``int8_vectorwise_quant`` (LLM.int8(): bitsandbytes/_ops.py and its backends) gives the int8
    rows of ``A``, one fp32 scale per row, and with a ``threshold`` (6.0 in ``Linear8bitLt``) the indices of the
    columns holding a value past it, whose matmul then runs apart in 16 bits: how many depends on the activations'
    values. Without values, none: the decomposition's few columns on real activations are not counted."""
    _noted("8-bit outlier columns (none assumed)")
    rows = A.numel() // A.shape[-1]
    quantized, scales = torch.empty(A.shape, dtype=torch.int8, device=A.device), torch.empty(rows, device=A.device)
    return quantized, scales, None if threshold == 0.0 else torch.empty(0, dtype=torch.int64, device=A.device)


def _no_outlier_matmul(A: torch.Tensor, CA: torch.Tensor, CB: torch.Tensor, SCA: torch.Tensor, SCB: torch.Tensor,
                       outlier_cols: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """bitsandbytes' ``int8_mixed_scaled_mm`` gives the dequantized int8 product (``A``'s dtype) and ``A``'s outlier
    columns it multiplied apart (bitsandbytes/backends/default/ops.py): with none (:func:`_no_outliers`), an empty
    tensor of ``A``'s dtype."""
    out = torch.empty((*CA.shape[:-1], CB.shape[0]), dtype=A.dtype, device=A.device)
    return out, torch.empty(0, dtype=A.dtype, device=A.device)


#: Ops whose results' sizes depend on values, by schema name, and the answer no-compute gives in their place.
WITHOUT_VALUES: dict[str, Callable[..., Any]] = {"bitsandbytes::int8_vectorwise_quant": _no_outliers,
                                                 "bitsandbytes::int8_mixed_scaled_mm": _no_outlier_matmul}


def without_values(func: Any, payload_args: tuple, payload_kwargs: dict) -> Any:
    """``func`` on meta payloads: its :data:`WITHOUT_VALUES` answer where it has one, else its Meta kernel's
    results (:func:`simulators.devices.no_compute.meta_results.run`)."""
    answer = WITHOUT_VALUES.get(func._schema.name)
    if answer is not None:
        return answer(*payload_args, **payload_kwargs)
    return meta_results.run(func, payload_args, payload_kwargs)


# -- collectives -------------------------------------------------------------------------------


def collective(func: Any, payload_args: tuple, payload_kwargs: dict) -> Any:
    """Run c10d op ``func`` on meta payloads: the ranks' descriptors are compared (:func:`check_collective`), then
    the Meta kernel runs, and its Work is one already completed whose result is the op's output (its first
    argument's payloads, as gloo's future carries them when the mock computes): DDP's reducer reads its buckets
    from it."""
    work = check_collective(func, payload_args)
    if work is not None:
        return work
    out = func(*payload_args, **payload_kwargs)
    done = torch.futures.Future()
    done.set_result([leaf for leaf in tree_flatten(payload_args[0])[0] if isinstance(leaf, torch.Tensor)])
    completed = torch._C._distributed_c10d._create_work_from_future(done).boxed()
    return tree_map(lambda value: completed if isinstance(value, torch.ScriptObject) else value, out)


def check_collective(func: Any, payload_args: tuple) -> Any:
    """Exchange ``func``'s descriptor with the ranks of its group and compare (see the module docstring).

    Returns the Work to return instead of the Meta kernel's (a point-to-point op's descriptor), or None."""
    _settle()
    name = func._schema.name.split("::")[-1]
    group = _argument(func, payload_args, "process_group")
    mine = describe(name, payload_args)
    if name == "send":
        return torch.ops.c10d.send([_encode(mine)], group, _argument(func, payload_args, "dst"), _argument(func, payload_args, "tag"))
    if name == "recv_":
        buffer = torch.zeros(DESCRIPTOR_BYTES, dtype=torch.uint8, device="cpu")
        peer = _argument(func, payload_args, "src")
        work = torch.ops.c10d.recv_([buffer], group, peer, _argument(func, payload_args, "tag"))
        _pending.append((torch._C._distributed_c10d.Work.unbox(work), buffer, mine, peer))
        return work
    if name != "recv_any_source_":  # the sender is known only once the data arrives
        _exchange(name, group, mine)
    return None


def verifying_params(verify: Callable) -> Callable:
    """``dist._verify_params_across_processes`` (DDP's check that every rank has the same parameters), done by
    descriptor for tensors with meta payloads: torch's broadcasts rank 0's shapes and reads them back."""

    @functools.wraps(verify)
    def verified(process_group: Any, params: Sequence[torch.Tensor], logger: Any = None) -> None:
        payload = getattr(params[0], "_payload", None) if params else None
        if payload is None or not payload.is_meta:
            return verify(process_group, params, logger)
        shapes = ",".join(f"{'x'.join(map(str, p.shape))}/{'x'.join(map(str, p.stride()))}" for p in params)
        _exchange("verify_params", process_group, f"verify_params|{len(params)} parameters|{shapes}")

    return verified


def describe(name: str, payload_args: tuple) -> str:
    """``op|dtype|shapes`` of a collective's tensors (the Meta payloads it is given)."""
    leaves = [leaf for leaf in tree_flatten(payload_args)[0] if isinstance(leaf, torch.Tensor)]
    dtype = str(leaves[0].dtype).removeprefix("torch.") if leaves else "-"
    shapes = ",".join("x".join(map(str, leaf.shape)) or "scalar" for leaf in leaves)
    return f"{name}|{dtype}|{shapes}"


def _exchange(name: str, group: Any, mine: str) -> None:
    """All-gather the descriptors of ``group``'s ranks; RuntimeError naming each rank's op when they differ."""
    unboxed = _unboxed(group)
    size, rank = unboxed.size(), unboxed.rank()
    gathered = torch.empty(size * DESCRIPTOR_BYTES, dtype=torch.uint8, device="cpu")
    torch.ops.c10d._allgather_base_(gathered, _encode(mine), unboxed.boxed(), False)[1].wait()
    compare(name, unboxed.group_name, rank, [_decode(row) for row in gathered.view(size, DESCRIPTOR_BYTES)])


def compare(name: str, group: str, rank: int, descriptors: list[str]) -> None:
    """RuntimeError naming each rank's op and shapes when the ``descriptors`` of ``group``'s ranks (this one is
    ``rank``) for op ``name`` differ."""
    sequence = _sequence.get(group, 0)
    _sequence[group] = sequence + 1
    if len({_compared(name, text) for text in descriptors}) > 1:
        raise RuntimeError(_mismatch(sequence, rank, descriptors))


def _settle() -> None:
    """Compare the descriptors of the receives that have arrived with what this rank expected."""
    for entry in list(_pending):
        work, buffer, mine, peer = entry
        if not work.is_completed():
            continue
        _pending.remove(entry)
        theirs = _decode(buffer)
        if theirs.split("|")[1:] != mine.split("|")[1:]:
            raise RuntimeError(f"simulators no-compute mode: point-to-point mismatch: this rank receives {mine}, "
                               f"rank {peer} sent {theirs}")


def _compared(name: str, descriptor: str) -> str:
    """What must agree across ranks: op and dtype, and the shapes unless ``name`` allows them to differ."""
    return "|".join(descriptor.split("|")[:2]) if name in UNEVEN_SHAPES else descriptor


def _mismatch(sequence: int, rank: int, descriptors: list[str]) -> str:
    """torch's words for ranks in different collectives (the dry run's summary reads them), then every rank's."""
    other = next(index for index, text in enumerate(descriptors) if text != descriptors[rank])
    return (f"Detected mismatch between collectives on ranks. Rank {rank} is running collective: "
            f"{_fingerprint(sequence, descriptors[rank])}, but Rank {other} is running collective: "
            f"{_fingerprint(sequence, descriptors[other])}. simulators no-compute check, per rank: "
            + "; ".join(f"rank {index}: {text}" for index, text in enumerate(descriptors)))


def _fingerprint(sequence: int, descriptor: str) -> str:
    op, dtype, shapes = (descriptor.split("|") + ["", ""])[:3]
    shape = "[" + shapes.split(",")[0].replace("x", ", ") + "]" if shapes else "[]"
    return (f"CollectiveFingerPrint(SequenceNumber={sequence}, OpType={op.rstrip('_').upper()}, TensorShape={shape}, "
            f"TensorDtypes={dtype.capitalize()}, TensorDeviceTypes=TensorOptions(device=meta))")


def _encode(text: str) -> torch.Tensor:
    """``text`` in :data:`DESCRIPTOR_BYTES` bytes (a long one: its start and a checksum of the whole)."""
    data = text.encode()
    if len(data) > DESCRIPTOR_BYTES:
        data = data[: DESCRIPTOR_BYTES - 9] + b"#" + f"{zlib.crc32(data):08x}".encode()
    return torch.frombuffer(bytearray(data.ljust(DESCRIPTOR_BYTES, b"\0")), dtype=torch.uint8)


def _decode(row: torch.Tensor) -> str:
    return bytes(row.tolist()).rstrip(b"\0").decode(errors="replace")


def _unboxed(group: Any) -> dist.ProcessGroup:
    """The ProcessGroup of a c10d op's argument (the dispatcher passes it as a script object)."""
    return group if isinstance(group, dist.ProcessGroup) else dist.ProcessGroup.unbox(group)


def _argument(func: Any, args: tuple, name: str) -> Any:
    """The positional argument ``name`` of ``func``'s schema among ``args``."""
    index = next(index for index, argument in enumerate(func._schema.arguments) if argument.name == name)
    return args[index]
