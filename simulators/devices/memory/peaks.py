"""Where and when each mock device reached its peak, what it held then, and the rank's memory report.

Rules (:class:`simulators.devices.memory.books.DeviceMemory` calls :func:`on_peak` and
:func:`on_out_of_memory`; the dry run reads the report, see
:mod:`simulators.dryrun`):

- the step of a peak is the optimizer step it happened in: 1 + the number of
  ``optimizer.step()`` calls completed by then (the optimizer that stepped
  most, when a script has several); 0 when the script has no optimizer;
- the line of a peak is the innermost frame of the user's script
  (``$SIMULATORS_SCRIPT``, set by the rank's bootstrap) on the stack when the
  device reached it;
- what a device held at its peak is split into the model's parameters, their
  gradients, the optimizers' state, communication buffers, activations (the
  storages autograd holds for backward, :mod:`simulators.devices.memory.activations`)
  and the rest (temporaries, outputs not saved, what the books cannot place). The parameters are those of every module made in
  the process and every optimizer's (for a DTensor, its local shard; for a
  DeepSpeed ZeRO-3 parameter, its partition ``ds_tensor``), split three ways:
  quantized weights (a bitsandbytes ``Params4bit`` or ``Int8Params`` with its
  quantization state: absmax, nested absmax, code, offset, the int8 row
  scales, on the parameter or its layer's ``MatmulLtState``), trainable (``requires_grad``, or held by an optimizer) and frozen
  (a LoRA's base); gradients are the parameters' ``.grad``; optimizer state is
  each optimizer's ``state``. Under DeepSpeed ZeRO, the gradients are also the
  ZeRO optimizer's gradient partitions, and its reduce buckets
  (``reduce_bucket_size`` elements each) are a part of their own,
  communication buffers (``ZERO_GRADIENTS``, ``ZERO_BUCKETS``). The split is taken again whenever the
  peak has grown by 1% since the last one (taking it costs a walk over the
  optimizers' tensors), so the model-state parts are those of a moment within
  1% of the peak and the rest is the peak minus them;
- the model states of a device are those three parts as they stand when an
  optimizer step ends (the gradients not yet zeroed), the most of each over
  the steps: what the bytes-per-parameter arithmetic predicts (issue 22, item 4);
- an allocation that would pass the budget is recorded (device, step, line and
  torch's message) before torch's ``OutOfMemoryError`` is raised;
- the batches the data loaders yielded, by position and size, are listed under
  ``batches`` (:mod:`simulators.devices.memory.batches`, which also runs the heaviest first
  where asked);
- the places where a no-compute run (:mod:`simulators.devices.no_compute.meta_payloads`) gave a
  placeholder for a value are listed under ``placeholders`` (line, what was asked, how often);
- with ``$SIMULATORS_STEPS`` set (``--steps N``), the rank ends (exit 0) once an
  optimizer has made N steps, its report written: a dry run of a long
  training loop stops after the steps that tell its memory;
- each device's timeline (:class:`simulators.devices.memory.history.Timeline`: allocated and
  reserved bytes after each change of its books, bounded, with the peak and the
  optimizer steps marked) is listed under ``timelines`` (the dry run's ``--report``
  plots it);
- the report (JSON) is written to :func:`simulators.spawn.memory_report_path` after every
  optimizer step, at an out-of-memory and when the process exits, so a rank
  stopped because another failed still tells what it knew;
- with ``$SIMULATORS_MEMORY_SNAPSHOT`` set to a folder (``--memory-snapshot DIR``), each
  ``cuda`` device also keeps its allocation history, and the rank writes
  ``DIR/rank<N>.pickle`` as ``torch.cuda.memory._dump_snapshot`` writes it
  (:func:`simulators.devices.memory.history.snapshot`) when it exits, stops at ``--steps`` or
  runs out of memory; an allocation's frames are the user's script's on the stack.
"""
from __future__ import annotations

import atexit
import json
import os
import pickle
import sys
import threading
import weakref
from typing import Any, Iterator

import torch

from simulators.devices.memory import activations, batches
from simulators.devices.families.machine import STEPS_ENV
from simulators.devices.memory.books import storage_key
from simulators.spawn import MEMORY_REPORTS_ENV as REPORT_DIR_ENV
from simulators.spawn import SCRIPT_ENV, memory_report_path

#: The folder where each rank writes its allocation history as a ``torch.cuda.memory`` snapshot (``--memory-snapshot``).
SNAPSHOT_ENV = "SIMULATORS_MEMORY_SNAPSHOT"
#: The peak must grow by this factor before its split is taken again.
SPLIT_GROWTH = 1.01
PARAMETER_PARTS = ("trainable_parameters", "frozen_parameters", "quantized_weights")
#: What the bytes-per-parameter arithmetic predicts ("model states") ...
MODEL_STATE_PARTS = (*PARAMETER_PARTS, "gradients", "optimizer_state")
#: ... and every part of a peak's split.
PARTS = (*MODEL_STATE_PARTS, "communication_buffers", "activations")
#: DeepSpeed's ZeRO optimizer (``DeepSpeedEngine.optimizer``): its gradient partitions, ``averaged_gradients`` (ZeRO-1/2,
#: deepspeed/runtime/zero/stage_1_and_2.py) or ``grad_partitions_flat_buffer`` (ZeRO-3, stage3.py) ...
ZERO_GRADIENTS = ("averaged_gradients", "grad_partitions_flat_buffer")
#: ... and its reduce buckets, ``ipg_buckets[dtype].buffer`` (a list of ``reduce_bucket_size`` tensors, or one for ZeRO-3).
ZERO_BUCKETS = "ipg_buckets"
#: bitsandbytes' parameter classes whose data is quantized (bitsandbytes/nn/modules.py).
QUANTIZED_CLASSES = frozenset({"Params4bit", "Int8Params"})
#: The tensors of a bitsandbytes ``QuantState`` (bitsandbytes/functional.py: ``QuantState``), its nested state's too.
QUANT_STATE_TENSORS = ("absmax", "code", "offset")
#: The tensors an ``Int8Params`` keeps beside its data: the int8 copy and the row scales, which ``Linear8bitLt``'s first
#: forward moves to the layer's ``MatmulLtState`` (bitsandbytes/nn/modules.py: ``init_8bit_state``).
INT8_TENSORS = ("CB", "SCB")


class _Recorder:
    """This process's optimizers, their step counts, and the report of the devices' books."""

    def __init__(self) -> None:
        self.optimizers: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        self.modules: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        #: The DeepSpeed engines among them, as the split finds them (their reduce buckets complete a split).
        self.engines: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self.steps: weakref.WeakKeyDictionary[torch.optim.Optimizer, int] = weakref.WeakKeyDictionary()
        self.books: list[Any] = []
        self.out_of_memory: dict[str, Any] | None = None
        #: The most steps any optimizer completed (kept when the optimizers are gone).
        self.completed = 0
        #: Per device ("cuda:0"): the most bytes of each model-state part at the end of an optimizer step.
        self.model_states: dict[str, dict[str, int]] = {}
        #: The libraries the run used whose GPU-chosen workspaces make its figures a lower bound ("cudnn").
        self.lower_bounds: set[str] = set()
        #: Per (user line, what was asked): how many values a no-compute run answered with placeholders there.
        self.placeholders: dict[tuple[str, str], int] = {}

    @property
    def step(self) -> int:
        """The optimizer step under way: 1 + the most steps any optimizer completed (0 without an optimizer)."""
        return 1 + self.completed if self.optimizers or self.completed else 0

    def stepped(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizers.add(optimizer)
        self.steps[optimizer] = self.steps.get(optimizer, 0) + 1
        self.completed = max(self.completed, self.steps[optimizer])
        for books in self.books:
            books.mark_step(self.step)
            for index, storages in books.held().items():
                states = self.model_states.setdefault(f"{books.device_type}:{index}", dict.fromkeys(MODEL_STATE_PARTS, 0))
                split = self.split(books.device_type, index, storages)
                for part in MODEL_STATE_PARTS:
                    states[part] = max(states[part], split[part])
        stopping = self.completed >= int(os.environ.get(STEPS_ENV) or 0) > 0
        self.write(final=stopping)
        if stopping:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)  # every rank stops at the same step; nothing of the script's runs after it

    def storages(self, device_type: str, index: int) -> dict[str, set[int]]:
        """The storage keys (as the books key them) of each model-state part on device ``index``.

        Taken with torch functions off: it reads attributes only, and every ``param.grad`` or hash of a tensor
        would otherwise pass through each torch-function mode the mock devices keep (a walk over a 70B's 723
        parameters, taken at every 1% of growth). A storage in two parts counts in the first of quantized,
        trainable, frozen."""
        keys: dict[str, set[int]] = {part: set() for part in PARTS}
        with torch._C.DisableTorchFunction():
            held = [param for optimizer in list(self.optimizers) for group in optimizer.param_groups for param in group["params"]]
            held_ids = {id(param) for param in held}
            params = list(held)
            for module in list(self.modules):
                fields = module.__dict__  # not getattr: FSDP1's __getattr__ recurses on a module mid-init
                params += fields.get("_parameters", {}).values()
                state = fields.get("state")  # an 8-bit layer's int8 copy and scales, moved to its MatmulLtState
                for name in INT8_TENSORS if type(state).__name__ == "MatmulLtState" else ():
                    _add_key(keys["quantized_weights"], getattr(state, name, None), device_type, index)
                if type(module).__name__ == "DeepSpeedEngine":
                    self.engines.add(module)
                    for part, tensor in _zero_buffers(fields.get("optimizer")):
                        _add_key(keys[part], tensor, device_type, index)
            for param in params:
                if param is None:
                    continue
                if type(param).__name__ in QUANTIZED_CLASSES:
                    for tensor in _quantized_tensors(param):
                        _add_key(keys["quantized_weights"], tensor, device_type, index)
                else:
                    trainable = param.requires_grad or id(param) in held_ids
                    part = keys["trainable_parameters" if trainable else "frozen_parameters"]
                    _add_key(part, getattr(param, "ds_tensor", param), device_type, index)
                _add_key(keys["gradients"], param.grad, device_type, index)
            for optimizer in list(self.optimizers):
                for state in optimizer.state.values():
                    for value in state.values():
                        _add_key(keys["optimizer_state"], value, device_type, index)
        keys["gradients"] -= keys["communication_buffers"]  # ZeRO-1/2 gradients that are views of a bucket
        keys["trainable_parameters"] -= keys["quantized_weights"]
        keys["frozen_parameters"] -= keys["quantized_weights"] | keys["trainable_parameters"]
        return keys

    def split(self, device_type: str, index: int, storages: dict[int, Any]) -> dict[str, int]:
        """Bytes of each model-state part among ``storages`` (the books' storages of device ``index``)."""
        return _sizes(self.storages(device_type, index), storages)

    def report(self) -> dict[str, Any]:
        devices = {}
        for books in self.books:
            for index, summary in books.summaries().items():
                name = f"{books.device_type}:{index}"
                devices[name] = {**summary, "model_states": self.model_states.get(name, dict.fromkeys(MODEL_STATE_PARTS, 0))}
        placeholders = [{"at": at, "what": what, "count": count} for (at, what), count in self.placeholders.items()]
        timelines = {f"{books.device_type}:{index}": timeline for books in self.books for index, timeline in books.timelines_report().items()}
        return {"steps": self.completed, "devices": devices, "out_of_memory": self.out_of_memory, "placeholders": placeholders,
                "batches": batches.RECORD.report(), "lower_bounds": sorted(self.lower_bounds), "timelines": timelines}

    def write(self, final: bool = False) -> None:
        """Write the report; ``final`` (the process ends or ran out of memory): the memory snapshot too, if asked."""
        if not self.books or not os.environ.get(REPORT_DIR_ENV):
            return
        rank = int(os.environ.get("RANK", "0"))
        path = memory_report_path(os.environ[REPORT_DIR_ENV], rank)
        partial = f"{path}.partial"
        with open(partial, "w", encoding="utf-8") as stream:
            json.dump(self.report(), stream)
        os.replace(partial, path)
        if final and os.environ.get(SNAPSHOT_ENV):
            self.write_snapshot(snapshot_path(os.environ[SNAPSHOT_ENV], rank))

    def write_snapshot(self, path: str) -> None:
        """The allocation history of this process's ``cuda`` devices at ``path``, pickled as ``_dump_snapshot`` does."""
        found: dict[str, Any] = {"segments": [], "device_traces": []}
        for books in self.books:
            if books.caching:
                found = books.snapshot()
        partial = f"{path}.partial"
        with open(partial, "wb") as stream:
            pickle.dump(found, stream)
        os.replace(partial, path)


RECORDER = _Recorder()


def _quantized_tensors(param: torch.Tensor) -> list[Any]:
    """A bitsandbytes quantized parameter and the tensors of its quantization state (see ``QUANT_STATE_TENSORS``)."""
    tensors = [param, *(getattr(param, name, None) for name in INT8_TENSORS)]
    state = getattr(param, "quant_state", None)
    while state is not None:
        tensors += [getattr(state, name, None) for name in QUANT_STATE_TENSORS]
        state = getattr(state, "state2", None)
    return tensors


def _zero_buffers(optimizer: Any) -> list[tuple[str, Any]]:
    """(part, tensor) of a DeepSpeed ZeRO optimizer's gradient partitions and reduce buckets (``ZERO_GRADIENTS``,
    ``ZERO_BUCKETS``); none for another optimizer."""
    fields = getattr(optimizer, "__dict__", {})
    found: list[tuple[str, Any]] = []
    for name in ZERO_GRADIENTS:
        value = fields.get(name)
        for tensors in value.values() if isinstance(value, dict) else [value]:
            found += [("gradients", tensor) for tensor in (tensors if isinstance(tensors, (list, tuple)) else [tensors])]
    for bucket in (fields.get(ZERO_BUCKETS) or {}).values():
        buffer = getattr(bucket, "buffer", None)
        found += [("communication_buffers", tensor) for tensor in (buffer if isinstance(buffer, list) else [buffer])]
    return found


def _add_key(keys: set[int], tensor: Any, device_type: str, index: int) -> None:
    local = getattr(tensor, "_local_tensor", tensor)  # a DTensor's shard
    # Attributes, not ``local.device`` (a torch.device made per call): only a mock device tensor has an index.
    if getattr(local, "device_index", None) == index and local.device_type == device_type:
        keys.add(storage_key(local._payload))


def snapshot_path(folder: str, rank: int) -> str:
    """The memory snapshot of rank ``rank`` in ``folder``."""
    return os.path.join(folder, f"rank{rank}.pickle")


#: Frames by (file, line, function): one dictionary each, which the snapshot's pickle then writes once.
_FRAMES: dict[tuple[str, int, str], dict[str, Any]] = {}


def user_frames() -> list[dict[str, Any]]:
    """The frames of the user's script on the stack (as :func:`user_line` finds them), innermost first, as torch's
    snapshot lists them (``filename``, ``line``, ``name``); else the innermost statement outside torch, the simulator
    and Python's library; else none."""
    found = [_frame(frame) for frame in _script_frames()]
    if found:
        return found
    statement = _statement()
    return [_frame(statement[0])] if statement else []


def _frame(frame: Any) -> dict[str, Any]:
    key = (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
    known = _FRAMES.get(key)
    if known is None:
        known = _FRAMES[key] = {"filename": key[0], "line": key[1], "name": key[2]}
    return known


def user_line() -> str:
    """``file:line`` of the innermost frame of the user's script on this thread's stack, else on the main
    thread's (autograd runs a device's backward in a thread of its own, while the script waits in
    ``backward()``); "" when neither has one."""
    frame = next(_script_frames(), None)
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}" if frame is not None else ""


def _script_frames() -> Iterator[Any]:
    """The frames of the user's script (``$SIMULATORS_SCRIPT``), innermost first, on this thread's stack, else on the
    main thread's (autograd runs a device's backward in a thread of its own, while the script waits in
    ``backward()``); none without a script."""
    script = os.environ.get(SCRIPT_ENV)
    if not script:
        return
    main = sys._current_frames().get(threading.main_thread().ident) if threading.current_thread() is not threading.main_thread() else None
    for start in (sys._getframe(1), main):
        found = False
        frame = start
        while frame is not None:
            if frame.f_code.co_filename == script:
                found = True
                yield frame
            frame = frame.f_back
        if found:
            return


def on_peak(books: Any, index: int, device: Any) -> None:
    """Device ``index`` of ``books`` reached a new peak: note its step and line, and its split if it grew 1% or is
    the step's first (a split of an earlier step would miss what the optimizer step since made)."""
    device.peak_step = RECORDER.step
    device.peak_at = user_line()
    if device.peak >= device.split_at * SPLIT_GROWTH or device.split_step != device.peak_step:
        held, keys = dict(device.storages), RECORDER.storages(books.device_type, index)
        device.split = _sizes(keys, held)
        device.split_pending = (held, keys, _statement()) if RECORDER.engines else None  # only buckets complete it
        device.split_at, device.split_step = device.peak, device.peak_step


def on_change(books: Any, index: int, device: Any) -> None:
    """The first allocation or release after the statement that made a split's peak completes the split: a reduce
    bucket held at the peak is counted once its list holds it (DeepSpeed makes the bucket, the allocation that makes
    the peak, then appends it to ``ipg_buckets[dtype].buffer``). The other parts are those of the peak (an
    all-gathered parameter that FSDP registers after its buffer is made stays in "other", as a gradient released
    since stays a gradient)."""
    held, keys, statement = device.split_pending
    if _statement() == statement:
        return
    device.split_pending = None
    held = {**device.storages, **held}  # the peak's own storage is booked after the peak is noted
    buckets: set[int] = set()
    with torch._C.DisableTorchFunction():  # attributes only, as the split's walk
        for engine in list(RECORDER.engines):
            for part, tensor in _zero_buffers(engine.__dict__.get("optimizer")):
                if part == "communication_buffers":
                    _add_key(buckets, tensor, books.device_type, index)
    keys["communication_buffers"] |= buckets - set().union(*keys.values())
    device.split = _sizes(keys, held)


#: Where the frames between a statement and the books are: torch, the simulator (``simulators/``, two folders above
#: this module's), Python's own library.
_INNER_FOLDERS = tuple(os.path.dirname(path) + os.sep for path in (torch.__file__, os.path.dirname(os.path.dirname(os.path.dirname(__file__))), os.__file__))


def _statement() -> tuple[Any, int] | None:
    """The innermost frame outside ``_INNER_FOLDERS``, and its line: the statement an allocation serves."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_INNER_FOLDERS):
        frame = frame.f_back
    return (frame, frame.f_lineno) if frame is not None else None


def _sizes(keys: dict[str, set[int]], storages: dict[int, Any]) -> dict[str, int]:
    """Bytes of each part's storage ``keys`` among ``storages``; activations are the storages autograd holds for
    backward (:mod:`simulators.devices.memory.activations`) in no other part."""
    sizes = {part: sum(storages[key].size for key in keys[part] if key in storages) for part in PARTS}
    placed = set().union(*keys.values())
    sizes["activations"] = sum(storage.size for key, storage in storages.items() if storage.saved and key not in placed)
    return sizes


def on_out_of_memory(books: Any, index: int, message: str) -> None:
    """Record the first allocation past the budget, then write the report (torch's error follows)."""
    if RECORDER.out_of_memory is None:
        RECORDER.out_of_memory = {"device": f"{books.device_type}:{index}", "step": RECORDER.step,
                                  "at": user_line(), "message": message}
    RECORDER.write(final=True)


def install(books: Any) -> None:
    """Record peaks and out-of-memory errors of ``books`` and report them, in a process whose launch asked for
    reports (``$SIMULATORS_MEMORY_REPORTS``); elsewhere (a conformance pool's ranks) nothing is recorded."""
    if not os.environ.get(REPORT_DIR_ENV):
        return
    books.recorder = sys.modules[__name__]
    books.keep_history(True, user_frames if os.environ.get(SNAPSHOT_ENV) else None)
    if not RECORDER.books:
        _watch_optimizers()
        batches.install()
        atexit.register(RECORDER.write, final=True)
    if books not in RECORDER.books:
        RECORDER.books.append(books)
        activations.install(books)


def _watch_optimizers() -> None:
    """Every module and optimizer this process makes is known from its creation; each ``step()`` is counted."""
    from torch.optim.optimizer import register_optimizer_step_post_hook  # not at import: torch loads this before torch.optim

    made_optimizer, made_module = torch.optim.Optimizer.__init__, torch.nn.Module.__init__

    def registering(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        made_optimizer(self, *args, **kwargs)
        RECORDER.optimizers.add(self)

    def registering_module(self: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        made_module(self, *args, **kwargs)
        RECORDER.modules.add(self)

    torch.optim.Optimizer.__init__ = registering
    torch.nn.Module.__init__ = registering_module
    register_optimizer_step_post_hook(lambda optimizer, args, kwargs: RECORDER.stepped(optimizer))
