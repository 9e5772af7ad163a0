"""Tensors on a mock device: they report the device and compute on a CPU payload.

Rules (catalog ``xla.distributed_type``, ``npu.distributed_type``, and every
case that runs on ``sim-xla`` / ``sim-npu``):

- a `DeviceTensor` wraps a plain CPU tensor (its payload); every aten op on
  it runs on the payload and its tensor results come back on the same mock
  device, so values are exactly those of CPU torch;
- mixing the mock device with another one (the CPU) in one op raises as
  real accelerators do: ``RuntimeError: Expected all tensors to be on the
  same device, but found at least two devices, xla:0 and cpu!``. CPU tensors
  of 0 dimensions are allowed (torch treats them as scalars on every
  accelerator), and so are the ops that move data between devices
  (``copy_``, ``_to_copy``). Two indices of the mock device mix no more
  than the mock device and the CPU do (``npu:0 and npu:1``);
- ``Tensor.to("npu:2")`` (and ``Module.to``, ``.npu(2)``) moves a tensor
  between indices as between devices;
- a device index past the family's :meth:`DeviceTensor.device_count` is
  refused as an invalid device ordinal; every device's memory is counted
  (:mod:`simulators.devices.memory.books`, the family's ``memory``), and a new
  storage past its budget raises ``torch.OutOfMemoryError``;
- a parameter on the mock device is an instance of the family's class, and
  ``type(param)(data, requires_grad=...)`` makes a ``Parameter`` of ``data``,
  as it would for a parameter of a real accelerator;
- ``.device`` reports the mock device (``xla:0``, ``npu:1``); ``.tolist()``
  and ``.item()`` read the values, ``.numpy()`` refuses as on CUDA; pickling
  (``torch.save``) keeps values and device, as for a real accelerator's
  tensor;
- random ops draw from the mock device's own generator
  (:meth:`DeviceTensor.generator_for`), not from the CPU's (the few without a
  ``generator`` argument, such as dropout, draw from the CPU's);
- ``untyped_storage()`` and ``data_ptr()`` are the payload's, so storage
  identity (shared weights, views) reads as on a device with memory;
- ``variable.data = other`` across the CPU and the mock device (FSDP moves
  and reshards parameters so; torch's ``set_data`` refuses another tensor
  type) makes ``variable`` a tensor of ``other``'s device with its values:
  the same object, still a parameter (:func:`swap_in`);
- with ``SIMULATORS_NO_COMPUTE=1`` the payload is a meta tensor: nothing is
  computed, values asked for are placeholders, collectives only check that
  the ranks agree (:mod:`simulators.devices.no_compute.meta_payloads`);
- a bf16 or fp16 matrix product, convolution or attention op computes as
  on a GPU: in float32, its results rounded once to their dtype
  (:mod:`simulators.devices.kernels.lowp_matmul`);
- :meth:`DeviceTensor.observe` sees every op first (XLA counts its step
  graphs there).

A subclass per device family sets ``device_type``. The C++ side sees torch's
PrivateUse1 device (see :mod:`simulators.devices.families.backend`), always with index
0: torch's Python device guard knows one device, and autograd runs a device's
backward on that device's queue. The index users see is kept here; a device
that names no index, or PrivateUse1's index 0 (what torch's C++ code passes
on when it allocates like an existing tensor, e.g. DDP's gradient buckets),
means the process's current device (:meth:`DeviceTensor.index_of`).
"""
from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import return_and_correct_aliasing

from simulators.devices.kernels import lowp_matmul
from simulators.devices.no_compute import meta_payloads
from simulators.devices.memory.books import DeviceMemory

#: Ops allowed to take tensors of different devices: they are how data moves between them.
_TRANSFERS = frozenset({torch.ops.aten.copy_.default, torch.ops.aten._to_copy.default})
#: Ops whose CPU-payload arguments must be adapted before the CPU runs them, and how
#: (``simulators.devices.families.backend`` fills it for the collectives gloo runs differently).
PAYLOAD_ADAPTERS: dict[Any, Callable[[tuple], tuple]] = {}
#: Ops that run on payloads with values by another kernel than their own (a GPU-only op's CPU twin), by op.
PAYLOAD_KERNELS: dict[Any, Callable[..., Any]] = {}
#: Ops whose GPU kernel is Python over the device tensors themselves, not their data, by op: they run on the mock
#: tensors as given (``simulators.devices.families.backend`` fills it: a functional collective's result wrapped in an
#: ``AsyncCollectiveTensor``, which must hold the device tensor, not its payload).
DEVICE_KERNELS: dict[Any, Callable[..., Any]] = {}


#: ``tensor.data = other`` as torch-function modes see it (a new method-wrapper at each access: compare with ==), and torch's own setter.
_SET_DATA = torch.Tensor.data.__set__
_SET_DATA_OF = torch._C.TensorBase.data.__set__
_GET_DATA_OF = torch._C.TensorBase.data.__get__


class FunctionRules(TorchFunctionMode):
    """The mock devices' one torch-function mode, entered for the process's life: each rule added
    (:func:`add_function_rule`) sees a torch call in turn, the last added first, and answers it or passes it on.

    One mode for all the rules, not one each: torch charges every Python-level torch call about 2 µs per mode
    on its stack, and a Llama-3-70B-shaped rank makes some 160,000 (measured: 1.1 µs a call with no mode, 2.5 µs
    with one, 7.9 µs with three). Like a mode of its own, a rule's own torch calls pass no rule, and the call a
    rule passes on (``proceed``) passes only the rules added before it."""

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return _rules[0](func, args, kwargs or {})


def _call(func: Callable, args: tuple, kwargs: dict) -> Any:
    return func(*args, **kwargs)


#: The rules chained, the last added first (``_rules[0]``); `FunctionRules` calls it.
_rules: list[Callable[[Callable, tuple, dict], Any]] = [_call]


def add_function_rule(rule: Callable[[Callable, tuple, dict, Callable], Any]) -> None:
    """Let ``rule(func, args, kwargs, proceed)`` see every torch call in this thread before the rules added
    earlier (``proceed(func, args, kwargs)`` passes the call on to them, then to torch); the first rule enters
    `FunctionRules`."""
    if _rules[0] is _call:
        FunctionRules().__enter__()
    inner = _rules[0]
    _rules[0] = lambda func, args, kwargs: rule(func, args, kwargs, inner)


def swapping_data(func: Callable, args: tuple, kwargs: dict, proceed: Callable) -> Any:
    """Sends ``variable.data = other`` to :func:`swap_in` where either is on a mock device.

    A torch-function rule, not the tensor class's ``__torch_function__``: torch's setter asks only ``variable``
    (a CPU parameter, when FSDP moves it onto the device) whether it overrides torch functions."""
    if func == _SET_DATA and (isinstance(args[0], DeviceTensor) or isinstance(args[1], DeviceTensor)):
        return swap_in(*args)
    return proceed(func, args, kwargs)


def swap_in(variable: torch.Tensor, data: torch.Tensor) -> None:
    """``variable.data = data`` where either is on a mock device (see the module docstring).

    Between two tensors of one mock family, torch's ``set_data`` takes the new sizes and the payload follows.
    Otherwise ``variable`` is swapped (``torch.utils.swap_tensors``) for a tensor of ``data``'s device with
    ``data``'s values, a parameter with ``variable``'s ``requires_grad`` if ``variable`` was one."""
    if isinstance(variable, DeviceTensor) and isinstance(data, DeviceTensor) and family_of(type(variable)) is family_of(type(data)):
        with torch._C.DisableTorchFunction():
            _SET_DATA_OF(variable, data)
        variable._payload, variable.device_index = data._payload, data.device_index
        return
    replacement = data.detach()
    if issubclass(type(variable), torch.nn.Parameter) and type(variable) is not torch.nn.Parameter and isinstance(data, DeviceTensor):
        # a library's Parameter subclass (bitsandbytes' Int8Params quantizes with ``self.data = int8_on_the_gpu``) stays
        # one, with its attributes (:mod:`simulators.devices.families.parameter_subclasses`); by its class, not ``isinstance``,
        # which a tensor of another class marked ``_is_param`` (a lazy host tensor's parameter) also passes
        attributes = dict(variable.__dict__)
        replacement = torch.Tensor._make_subclass(type(variable), replacement, variable.requires_grad)
        replacement.__dict__.update(attributes)
    elif isinstance(variable, torch.nn.Parameter) or getattr(variable, "_is_param", False):
        replacement = torch.nn.Parameter(replacement, requires_grad=variable.requires_grad)
    else:
        replacement.requires_grad_(variable.requires_grad)
    swap_tensors(variable, replacement)


#: torch's ``swap_tensors``, and a copy of it that does not refuse tensors with weak references (see `swap_tensors`).
_TORCH_SWAP_TENSORS = torch.utils.swap_tensors
_SWAP_IGNORING_WEAKREFS = type(_TORCH_SWAP_TENSORS)(
    _TORCH_SWAP_TENSORS.__code__,
    {**_TORCH_SWAP_TENSORS.__globals__, "weakref": SimpleNamespace(getweakrefs=lambda obj: [])},
    _TORCH_SWAP_TENSORS.__name__,
)


def swap_tensors(t1: torch.Tensor, t2: torch.Tensor) -> None:
    """``torch.utils.swap_tensors``, which lets a parameter with weak references become a mock one.

    On a GPU, ``Module.to("cuda")`` keeps each parameter object through ``param.data = ...``; a mock
    tensor is a wrapper subclass, so torch swaps it in (``torch.utils.swap_tensors``), which refuses a
    tensor that has weak references ("Cannot swap t1 because it has weakref associated with it").
    DeepSpeed puts a ``weakref.finalize`` on every parameter (its name map, ``deepspeed.utils.debug``)
    before it moves the module. The Python object survives a swap, so references to it stay right:
    the check is skipped where a mock tensor takes part."""
    if isinstance(t1, DeviceTensor) or isinstance(t2, DeviceTensor):
        return _SWAP_IGNORING_WEAKREFS(t1, t2)
    return _TORCH_SWAP_TENSORS(t1, t2)


class DeviceTensor(torch.Tensor):
    """A tensor on a mock device; see the module docstring for the rules."""

    #: The device type the tensor reports (``"xla"``, ``"npu"``).
    device_type: str = ""
    _payload: torch.Tensor
    #: The index of the mock device (``1`` for ``npu:1``).
    device_index: int
    #: The memory books of the family's devices in this process (each family sets its own).
    memory: DeviceMemory

    @staticmethod
    def __new__(cls, payload: torch.Tensor, index: int = 0, requires_grad: bool | None = None) -> torch.Tensor:
        if requires_grad is not None:
            # ``type(param)(data, requires_grad=...)``, the idiom libraries rebuild a parameter with.
            return torch.nn.Parameter(payload, requires_grad=requires_grad)
        tensor = torch.Tensor._make_wrapper_subclass(
            cls,
            payload.size(),
            strides=payload.stride(),
            storage_offset=payload.storage_offset(),
            dtype=payload.dtype,
            layout=payload.layout,
            device=torch.device(torch._C._get_privateuse1_backend_name(), 0),
            requires_grad=payload.requires_grad,
        )
        tensor._payload = payload
        tensor.device_index = index
        return tensor

    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def data(self) -> torch.Tensor:
        return _GET_DATA_OF(self)

    @data.setter
    def data(self, value: torch.Tensor) -> None:
        # ``variable.data = other`` on a mock tensor, in any thread. `swapping_data` is a rule of a mode, and torch
        # keeps modes per thread: autograd runs a mock device's backward in its own device thread, where none is
        # entered, so DeepSpeed's hooks there (ZeRO-3 gathering a parameter before its module's backward,
        # ZeRO-2 moving gradients into its buckets) would reach torch's setter, which takes the new sizes
        # and leaves the payload behind (a (1, 64) weight computing on a (0,) payload: "mat2 must be a matrix").
        swap_in(self, value)

    @property
    def device(self) -> torch.device:
        return torch.device(self.device_type, self.device_index)

    @classmethod
    def current_index(cls) -> int:
        """The index of this process's current device of the family (families override)."""
        return 0

    @classmethod
    def index_of(cls, device: torch.device | str | None) -> int:
        """The mock device index ``device`` means (see the module docstring)."""
        device = torch.device(device) if device is not None else None
        if device is None or not device.index:
            return cls.current_index()
        return device.index

    @classmethod
    def device_count(cls) -> int:
        """How many devices of the family this process sees (families override)."""
        return 1

    @classmethod
    def check_index(cls, index: int) -> None:
        """Refuse ``index`` when this process has no such device of the family, as torch does."""
        if index == 0:  # every process has a device 0 (and most ops run there: no need to ask)
            return
        count = cls.device_count()
        if not 0 <= index < count:
            raise RuntimeError(
                f"{cls.device_type.upper()} error: invalid device ordinal: {cls.device_type}:{index} "
                f"(this simulated machine has {count} {cls.device_type} device(s) per rank; "
                "see simulators.devices.families.machine)"
            )

    @classmethod
    def wrap(cls, payload: torch.Tensor, index: int, *, checked: bool = False) -> DeviceTensor:
        """``payload`` (a CPU tensor) as a tensor on this family's device ``index``, counted in its memory.

        ``checked``: ``index`` is known to exist (an op's inputs are on it), so :meth:`check_index`, which reads the
        machine's settings from the environment, is not asked again (a 70B rank wraps some 27,000 op results)."""
        if not checked:
            cls.check_index(index)
        tensor = cls(payload, index)
        cls.memory.track(payload, index)
        return tensor

    def to(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """``Tensor.to``, with a move to another index of the family copying to that device.

        (torch's C++ side sees every mock tensor on index 0, so it would take
        ``npu:2 -> npu:0`` for a no-op, and send the gradient of ``npu:0 ->
        npu:1`` back on ``npu:1``: :class:`_MoveBetweenIndices` does both.)
        A move to the device the tensor is on, its dtype and layout kept and no
        ``copy=True``, returns the tensor itself, as torch does (a parameter
        stays that parameter: ``nn.Parameter(t).to("cuda") is`` the parameter
        on a GPU, where torch's C++ side, seeing ``cuda`` as another device
        than the mock's own, would copy).
        """
        parsed = {key: value for key, value in kwargs.items() if key != "copy"}  # _parse_to knows no ``copy``
        device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **parsed)
        if (device is not None and device.type == self.device_type and self.index_of(device) == self.device_index
                and dtype in (None, self.dtype) and memory_format in (None, torch.preserve_format)
                and not kwargs.get("copy", False)):
            return self
        if device is None or device.type != self.device_type or self.index_of(device) == self.device_index:
            return super().to(*args, **kwargs)
        return _MoveBetweenIndices.apply(self, self.index_of(device), dtype or self.dtype, memory_format)

    @classmethod
    def generator_for(cls, index: int) -> torch.Generator:
        """The generator random ops on device ``index`` draw from (families override)."""
        raise NotImplementedError(f"{cls.__name__} has no device generator")

    @classmethod
    def observe(cls, func: Any, tensors: list[DeviceTensor], args: tuple, kwargs: dict) -> None:
        """Called before every op on this family's tensors, with the device tensors it takes and its arguments."""

    def tolist(self) -> Any:
        if self._payload.is_meta:
            meta_payloads.record("tolist")
            return meta_payloads.host_copy(self.shape, self.dtype).tolist()
        return self._payload.tolist()

    def __format__(self, format_spec: str) -> str:
        """As a CUDA tensor formats: a 0-dimensional one as its value (torch formats only plain tensors so)."""
        if self.dim() == 0:
            return self.item().__format__(format_spec)
        return object.__format__(self, format_spec)

    def untyped_storage(self) -> torch.UntypedStorage:
        return self._payload.untyped_storage()

    def data_ptr(self) -> int:
        return meta_payloads.pointer(self._payload) if self._payload.is_meta else self._payload.data_ptr()

    def numpy(self, *, force: bool = False) -> Any:
        if force and self._payload.is_meta:
            meta_payloads.record("numpy")
            return meta_payloads.host_copy(self.shape, self.dtype).numpy()
        if force:
            return self._payload.numpy(force=True)
        raise TypeError(
            f"can't convert {self.device} device type tensor to numpy. "
            "Use Tensor.cpu() to copy the tensor to host memory first."
        )

    def __reduce_ex__(self, protocol: int) -> Any:
        # As torch pickles an XLA tensor: a CPU copy and the device, not this class.
        cpu = self._payload.detach().clone()
        return torch._utils._rebuild_device_tensor_from_cpu_tensor, (cpu, self.dtype, str(self.device), self.requires_grad)

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        text = repr(self._payload).replace(", device='meta'", "")  # no-compute mode: "tensor(..., size=(2,))"
        return f"{text[:-1]}, device='{self.device}')"

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        leaves = _leaves((args, kwargs))
        if any(isinstance(leaf, torch.Tensor) and _dispatches_itself(type(leaf)) for leaf in leaves):
            return NotImplemented  # a DTensor (or another tensor subclass) among the arguments dispatches first, as on a GPU
        if func in DEVICE_KERNELS:
            return DEVICE_KERNELS[func](*args, **kwargs)
        on_device = [leaf for leaf in leaves if isinstance(leaf, DeviceTensor)]
        if func not in _TRANSFERS:
            _check_one_device(func, on_device, leaves)
        first = on_device[0]
        first.observe(func, on_device, args, kwargs)
        target = kwargs.get("device")
        payload_args, payload_kwargs = _map(_payload_of, (args, kwargs))
        payloads = [tensor._payload for tensor in on_device]
        meta = any(payload.is_meta for payload in payloads)
        settle = None
        if meta and not all(payload.is_meta for payload in payloads):  # no-compute mode: kept values among them
            payload_args, payload_kwargs, settle = meta_payloads.read_as_meta(func, payloads, payload_args, payload_kwargs)
        if meta:
            answered, value = meta_payloads.value_of(func, payload_args, payload_kwargs)
            if answered:
                return value
        if target is not None and torch.device(target).type in ("cpu", "meta"):
            return func(*payload_args, **payload_kwargs)
        index = first.device_index if target is None else first.index_of(target)
        if _takes_generator(func) and payload_kwargs.get("generator") is None and not meta:
            payload_kwargs["generator"] = first.generator_for(index)
        if target is not None:
            payload_kwargs["device"] = meta_payloads.payload_device() if meta else torch.device("cpu")
        if func in PAYLOAD_ADAPTERS:
            payload_args = PAYLOAD_ADAPTERS[func](payload_args)
        if meta and func.namespace == "c10d":
            out = meta_payloads.collective(func, payload_args, payload_kwargs)
        elif func.namespace == "c10d":
            out = _collective_on_aliases(func, payload_args, payload_kwargs)
        elif meta:
            out = meta_payloads.without_values(func, payload_args, payload_kwargs)
        elif func in PAYLOAD_KERNELS:
            out = PAYLOAD_KERNELS[func](*payload_args, **payload_kwargs)
        else:  # bf16/fp16 matrix ops as a GPU computes them: fp32 accumulation, rounded once
            out = lowp_matmul.run(func, payload_args, payload_kwargs)
        if settle is not None:
            out = settle(out)
        family = family_of(type(first))
        wrapped = _map(_rewrapper(family, index, on_device, checked=target is None), out)
        if torch.Tag.inplace_view in func.tags:  # resize_, t_, set_...: the rewrap gave ``self`` its payload's new shape
            return args[0]
        if not _aliases(func):
            return wrapped
        if family is not type(first):
            args = _read_aliases_of_family(func, args)
        return return_and_correct_aliasing(func, args, kwargs, wrapped)


class _MoveBetweenIndices(torch.autograd.Function):
    """A copy of a mock tensor onto another index of its family; the gradient goes back to the source's."""

    @staticmethod
    def forward(ctx: Any, tensor: DeviceTensor, index: int, dtype: torch.dtype, memory_format: Any) -> DeviceTensor:
        ctx.source = (tensor.device_index, tensor.dtype)
        return _moved(tensor, index, dtype, memory_format)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        index, dtype = ctx.source
        return _moved(grad, index, dtype, None), None, None, None


def family_of(cls: type[DeviceTensor]) -> type[DeviceTensor]:
    """The family class of a mock tensor's class: the class op results are made of (a library's parameter subclass
    on the device, :mod:`simulators.devices.families.parameter_subclasses`, gives results of its family, not of itself)."""
    return getattr(cls, "_family", cls)


@functools.cache
def _read_alias_positions(func: Any) -> frozenset[int]:
    """The positions of ``func``'s arguments its results are read-only views of."""
    return frozenset(index for index, argument in enumerate(func._schema.arguments)
                     if argument.alias_info is not None and not argument.alias_info.is_write)


def _read_aliases_of_family(func: Any, args: tuple) -> tuple:
    """``args`` with each library parameter subclass on the device that ``func`` returns a view of (``detach``,
    ``view``...) replaced by a tensor of its family on the same payload and storage: the view is of the family (as on
    a GPU, where a view of a ``Params4bit`` is a plain tensor), and ``return_and_correct_aliasing`` wants a view's
    type to be its base's."""
    viewed = _read_alias_positions(func)

    def as_family(tensor: Any) -> Any:
        family = family_of(type(tensor)) if isinstance(tensor, DeviceTensor) else None
        if family is None or family is type(tensor):
            return tensor
        twin = family(tensor._payload, tensor.device_index)
        torch._functionalize_unsafe_set(twin, tensor)
        return twin

    return tuple(as_family(value) if index in viewed else value for index, value in enumerate(args))


def _moved(tensor: DeviceTensor, index: int, dtype: torch.dtype, memory_format: Any) -> DeviceTensor:
    """A copy of ``tensor`` on index ``index`` of its family, as ``dtype``."""
    options = {"memory_format": memory_format} if memory_format is not None else {}
    return family_of(type(tensor)).wrap(tensor._payload.to(dtype, copy=True, **options), index)


@functools.cache
def _dispatches_itself(cls: type) -> bool:
    """Whether tensors of ``cls`` dispatch ops themselves and are not the simulator's own (a DTensor, whose dispatch
    raises for a mix with plain tensors, or unwraps its shards and dispatches again). Asked for every argument of
    every op: answered once per class."""
    if cls in (torch.Tensor, torch.nn.Parameter):
        return False
    dispatch = getattr(cls, "__torch_dispatch__", None)
    owner = getattr(dispatch, "__module__", "") or ""
    return dispatch is not None and owner != "torch._tensor" and not owner.startswith("simulators.")


def _leaves(value: Any) -> list[Any]:
    """The leaves of an op's arguments (tuples, lists and dicts of them), as ``tree_flatten`` gives them: the
    dispatch of every op walks them, and torch's generic pytree costs several times more for these three."""
    if type(value) in _CONTAINERS:
        return [leaf for item in value for leaf in _leaves(item)]
    if type(value) is dict:
        return [leaf for item in value.values() for leaf in _leaves(item)]
    return [value]


def _map(function: Callable[[Any], Any], value: Any) -> Any:
    """``tree_map(function, value)`` for the tuples, lists and dicts ops take and return (see `_leaves`)."""
    if type(value) in _CONTAINERS:
        return type(value)(_map(function, item) for item in value)
    if type(value) is dict:
        return {key: _map(function, item) for key, item in value.items()}
    return function(value)


_CONTAINERS = (tuple, list)


@functools.cache
def _aliases(func: Any) -> bool:
    """Whether ``func``'s schema has an argument or result that aliases or mutates (views, in-place and ``out=``
    ops): only those need ``return_and_correct_aliasing``, which leaves the others' results as they are."""
    schema = func._schema
    return any(item.alias_info is not None for item in (*schema.arguments, *schema.returns))


@functools.cache
def _takes_generator(func: Any) -> bool:
    """Whether ``func`` is a random op that takes a ``generator`` (dropout, for one, does not)."""
    return torch.Tag.nondeterministic_seeded in func.tags and any(
        argument.name == "generator" for argument in func._schema.arguments
    )


def _collective_on_aliases(func: Any, args: tuple, kwargs: dict) -> Any:
    """Run c10d op ``func`` on aliases of its tensors (the same storage, other tensor objects), and give back
    the tensors themselves where its results are those aliases.

    gloo's Work holds the tensors it was given until its worker thread lets the Work go, a moment no line of
    the script fixes (under load, well after ``wait()``); the memory books watch the payload objects
    (`DeviceMemory.allocated`), so were gloo given the payloads, the free of a collective's input (FSDP2's
    reduce-scatter buffer) would be counted late in some runs and the peak would differ from run to run."""
    given: dict[int, torch.Tensor] = {}

    def alias(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        twin = value.detach()
        given[id(twin)] = value
        return twin

    aliased_args, aliased_kwargs = _map(alias, (args, kwargs))
    out = func(*aliased_args, **aliased_kwargs)
    return _map(lambda value: given.get(id(value), value) if isinstance(value, torch.Tensor) else value, out)


def _payload_of(value: Any) -> Any:
    return value._payload if isinstance(value, DeviceTensor) else value


def _rewrapper(cls: type[DeviceTensor], index: int, inputs: list[DeviceTensor], checked: bool) -> Callable[[Any], Any]:
    """Maps an op's results back to the device: an input's own payload to that input, others wrapped anew (on
    ``index``, ``checked`` when it is the inputs' own)."""
    by_payload = {id(tensor._payload): tensor for tensor in inputs}

    def rewrap(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        known = by_payload.get(id(value))
        if known is None:
            return cls.wrap(value, index, checked=checked)
        cls.memory.resized(value, known.device_index)  # an out= or in-place op may have resized its storage
        _follow_payload(known)
        return known

    return rewrap


def _follow_payload(tensor: DeviceTensor) -> None:
    """Give ``tensor`` (the wrapper) its payload's sizes, strides and offset if an op changed them.

    An ``out=`` op resizes its output's payload (``torch.arange(n, device=...)`` fills a 0-element
    ``empty``), and an inplace-view op (``resize_``, ``t_``, ``set_``) reshapes it; torch's C++ side
    (vmap's batching rules, autograd, ``.shape``) reads the wrapper's own metadata. It is set as
    ``return_and_correct_aliasing`` sets an inplace-view op's (no dispatch, the Meta kernel), through
    ``set_`` on the wrapper's own empty storage: the Meta ``resize_`` takes only meta tensors."""
    payload = tensor._payload
    if (tensor.shape, tensor.stride(), tensor.storage_offset()) == (payload.shape, payload.stride(), payload.storage_offset()):
        return
    with torch.utils._mode_utils.no_dispatch():
        meta_in_tls = torch._C._meta_in_tls_dispatch_include()
        torch._C._set_meta_in_tls_dispatch_include(True)
        try:
            torch.ops.aten.set_.source_Storage_storage_offset(
                tensor, torch._C.TensorBase.untyped_storage(tensor), payload.storage_offset(), payload.shape, payload.stride()
            )
        finally:
            torch._C._set_meta_in_tls_dispatch_include(meta_in_tls)


def _check_one_device(func: Any, on_device: list[DeviceTensor], leaves: list[Any]) -> None:
    """Raise as real accelerators do when ``func`` gets tensors of the mock device and of another one."""
    first = on_device[0]
    elsewhere: list[torch.Tensor] = [tensor for tensor in on_device if tensor.device_index != first.device_index]
    elsewhere += [
        leaf for leaf in leaves
        if isinstance(leaf, torch.Tensor) and not isinstance(leaf, DeviceTensor) and leaf.dim() > 0
    ]
    if elsewhere:
        raise RuntimeError(
            "Expected all tensors to be on the same device, but found at least two devices, "
            f"{first.device} and {elsewhere[0].device}! (in {func}; simulators mock device)"
        )
