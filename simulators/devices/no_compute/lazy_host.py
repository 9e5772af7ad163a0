"""Lazy host tensors: in no-compute mode, the large CPU tensors a script makes hold no host memory either.

Most scripts build their model on the CPU (``LlamaForCausalLM(config)``, a
state dict loaded there) before ``accelerator.prepare`` moves it to the GPUs;
with ``SIMULATORS_NO_COMPUTE=1`` (:mod:`simulators.devices.no_compute.meta_payloads`) the
mock devices' tensors carry meta payloads, and so, by these rules, do the
script's large host tensors (issue 33, item 4):

- a CPU tensor the script makes of at least :func:`threshold` bytes (1 MiB;
  ``SIMULATORS_LAZY_HOST_MIN_BYTES`` sets another) is a `LazyHostTensor`: it
  reports ``device.type == "cpu"`` (checks in user code, accelerate and
  transformers hold) and carries a meta payload. Made so: the factories
  (``torch.empty``, ``zeros``, ``ones``, ``full``, ``rand``, ``randn``,
  ``randint``, ``randperm``, ``arange``, ``linspace``, ``logspace``, ``eye``,
  ``empty_strided``, ``Tensor.new_empty`` / ``new_zeros`` / ``new_ones`` /
  ``new_full``) on the CPU, ``torch.load`` (a file path is mapped, not read:
  a tensor whose storage is that large becomes lazy, views of one storage
  stay views of one payload; the other tensors are copied out of the
  mapping with their values) and safetensors' ``safe_open`` (``get_tensor``,
  an index of ``get_slice``: ``safetensors.torch.load_file`` and
  ``transformers``' ``from_pretrained`` read so; a large tensor's bytes are
  not read). A smaller tensor is an ordinary one, with values, so control
  flow on small host data works;
- every op on a lazy tensor runs on the payloads (shape, dtype and
  broadcasting rules, nothing computed; ``nn.init``'s in-place fills, views,
  ``.data``, ``nn.Parameter(...)``, ``state_dict`` / ``load_state_dict``); an
  ordinary CPU tensor taking part is read as a meta tensor of its shape.
  Results on the CPU are lazy; a result on the mock device (``.to("cuda")``,
  ``Module.to``, accelerate's ``prepare``, ``torch.empty_like(t,
  device="cuda")``) is a tensor of that device with a meta payload, counted
  in its memory books at its size in bytes, as a computed copy would be;
- a value asked of a lazy tensor (``.item()``, ``bool(t)``, ``.tolist()``,
  ``.numpy()``, ``f"{t}"``) is a placeholder (zeros), recorded as the
  mock devices' are (:func:`simulators.devices.no_compute.meta_payloads.record`); so is an
  ordinary CPU tensor written from a lazy one (it gets zeros: ``"cpu copy"``
  for ``copy_``, ``"cpu value"`` for another op) and a lazy tensor pickled
  (``torch.save``: zeros of its shape taking one element, ``"save"``);
- ``data_ptr()`` is its storage record's address plus its offset (a meta
  tensor's is 0; :func:`simulators.devices.no_compute.meta_payloads.pointer`): tensors of
  different storages have different pointers, as libraries that tell
  parameters apart by them expect (HF accelerate's FSDP2 preparation maps
  the optimizer's parameters so);
- ``variable.data = other`` between a lazy tensor and another tensor gives
  ``variable`` the other's payload or, across kinds, swaps it for a tensor of
  the other's kind (the same object, still a parameter), as for the mock devices;
- a collective on lazy tensors (gloo on the host) moves no data: the ranks
  compare descriptors as for the mock devices' (:func:`simulators.devices.no_compute.meta_payloads.collective`);
- a lazy tensor meeting a mock device tensor in an op other than a copy raises
  the mock's mixing error (``cuda:0 and cpu``), as an ordinary CPU tensor does.

Not lazy: CPU tensors made from Python or numpy data (``torch.tensor``,
``torch.from_numpy``) or by ops on ordinary tensors, and what a module that
bound ``safetensors.safe_open`` before the mock was installed reads. Nothing
changes while no-compute mode is off (each factory and load checks it).
"""
from __future__ import annotations

import functools
import os
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import return_and_correct_aliasing
from torch.utils._pytree import tree_map_only

from simulators.devices.no_compute import meta_payloads
from simulators.devices.families.tensor import DeviceTensor, _aliases, _follow_payload, _leaves, _map, add_function_rule, swap_in

#: Bytes from which a host tensor made in no-compute mode is lazy, unless this variable gives another number.
THRESHOLD_ENV = "SIMULATORS_LAZY_HOST_MIN_BYTES"
DEFAULT_THRESHOLD = 1 << 20

_META = torch.device("meta")
_CPU = torch.device("cpu")
_aten = torch.ops.aten
#: The installed mock device family (its tensor class): where a lazy tensor goes on ``.to(<its device>)``.
_family: list[type[DeviceTensor]] = []

#: In-place fills: on a lazy tensor they change nothing a meta payload holds (torch's meta kernels for the random
#: ones are Python decompositions: a 7B Llama's initialisation would spend most of its time in them).
_FILLS = frozenset({
    _aten.normal_.default, _aten.uniform_.default, _aten.fill_.Scalar, _aten.zero_.default, _aten.random_.default,
    getattr(_aten.random_, "from"), _aten.random_.to, _aten.exponential_.default, _aten.log_normal_.default,
    _aten.cauchy_.default, _aten.geometric_.default, _aten.bernoulli_.float,
})

_SET_DATA = torch.Tensor.data.__set__
_SET_DATA_OF = torch._C.TensorBase.data.__set__
_GET_DATA_OF = torch._C.TensorBase.data.__get__


def threshold() -> int:
    """Bytes from which a host tensor is lazy in no-compute mode (see the module docstring)."""
    text = os.environ.get(THRESHOLD_ENV, "").strip()
    return int(text) if text else DEFAULT_THRESHOLD


class LazyHostTensor(torch.Tensor):
    """A CPU tensor without host memory: see the module docstring."""

    _payload: torch.Tensor

    @staticmethod
    def __new__(cls, data: torch.Tensor, requires_grad: bool = True, **attributes: Any) -> torch.Tensor:
        """``type(param)(data, requires_grad=..., **param.__dict__)``, the idiom libraries rebuild a parameter with
        (``init_empty_weights`` of accelerate and transformers): a ``Parameter`` of ``data``, with the attributes."""
        param = torch.nn.Parameter(data, requires_grad=requires_grad)
        for name, value in attributes.items():
            if name not in ("_payload", "_is_param"):
                setattr(param, name, value)
        return param

    @staticmethod
    def wrap(payload: torch.Tensor, requires_grad: bool = False) -> "LazyHostTensor":
        """A lazy tensor over meta tensor ``payload``."""
        tensor = torch.Tensor._make_wrapper_subclass(
            LazyHostTensor, payload.size(), strides=payload.stride(), storage_offset=payload.storage_offset(),
            dtype=payload.dtype, layout=payload.layout, device=_CPU, requires_grad=requires_grad,
        )
        tensor._payload = payload
        return tensor

    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def data(self) -> torch.Tensor:
        return _GET_DATA_OF(self)

    @data.setter
    def data(self, value: torch.Tensor) -> None:
        set_data(self, value)

    def untyped_storage(self) -> torch.UntypedStorage:
        return self._payload.untyped_storage()

    def data_ptr(self) -> int:
        return meta_payloads.pointer(self._payload)

    def tolist(self) -> Any:
        meta_payloads.record("tolist")
        return meta_payloads.host_copy(self.shape, self.dtype).tolist()

    def numpy(self, *, force: bool = False) -> Any:
        meta_payloads.record("numpy")
        return meta_payloads.host_copy(self.shape, self.dtype).numpy()

    def __format__(self, format_spec: str) -> str:
        if self.dim() == 0:
            return self.item().__format__(format_spec)
        return object.__format__(self, format_spec)

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return repr(self._payload).replace(", device='meta'", "")

    def __reduce_ex__(self, protocol: int) -> Any:
        meta_payloads.record("save")
        return meta_payloads.host_copy(self.shape, self.dtype).__reduce_ex__(protocol)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if any(issubclass(kind, DeviceTensor) for kind in types):
            return NotImplemented  # a mock device tensor takes part: its rules (a copy, or the mixing error)
        kwargs = kwargs or {}
        if func in _FILLS and isinstance(args[0], LazyHostTensor):
            return args[0]
        if func is _aten._local_scalar_dense.default:
            meta_payloads.record("item")
            return meta_payloads.scalar(args[0].dtype)
        if func is _aten.copy_.default and not isinstance(args[0], LazyHostTensor):
            return _copied_from_lazy(args[0], args[1])
        target = kwargs.get("device")
        target = torch.device(target) if target is not None else None
        lazies = [leaf for leaf in _leaves((args, kwargs)) if isinstance(leaf, LazyHostTensor)]
        real: dict[int, torch.Tensor] = {}

        def payload_of(value: Any) -> Any:
            if isinstance(value, LazyHostTensor):
                return value._payload
            if isinstance(value, torch.Tensor) and not value.is_meta:  # an ordinary CPU tensor: read as its shape
                twin = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=_META)
                real[id(twin)] = value
                return twin
            return value

        payload_args, payload_kwargs = _map(payload_of, (args, kwargs))
        if target is not None:
            payload_kwargs["device"] = _META
        payload_kwargs.pop("generator", None)
        if payload_kwargs.get("pin_memory"):
            payload_kwargs["pin_memory"] = False
        if func.namespace == "c10d":  # as a mock device's: the ranks compare descriptors, no data moves
            out = meta_payloads.collective(func, payload_args, payload_kwargs)
        else:
            out = func(*payload_args, **payload_kwargs)
        wrapped = _map(_rewrapper(lazies, real, target), out)
        if torch.Tag.inplace_view in func.tags:
            return args[0]
        return return_and_correct_aliasing(func, args, kwargs, wrapped) if _aliases(func) else wrapped


def _rewrapper(lazies: list[LazyHostTensor], real: dict[int, torch.Tensor], target: torch.device | None) -> Callable[[Any], Any]:
    """Maps an op's results on payloads back: an input's own payload to that input, new payloads to lazy tensors
    (or to the mock device / left on meta, where the op named that device)."""
    by_payload = {id(tensor._payload): tensor for tensor in lazies}
    family = _family[0] if _family else None

    def rewrap(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        known = by_payload.get(id(value))
        if known is not None:
            _follow_payload(known)
            return known
        written = real.get(id(value))
        if written is not None:  # an ordinary CPU tensor an op wrote into from a lazy one
            meta_payloads.record("cpu value")
            return written.zero_()
        if not value.is_meta or (target is not None and target.type == "meta"):
            return value
        if target is not None and family is not None and _is_family(target, family):
            return family.wrap(value, family.index_of(target))
        return LazyHostTensor.wrap(value)

    return rewrap


def _is_family(device: torch.device, family: type[DeviceTensor]) -> bool:
    return device.type in (family.device_type, torch._C._get_privateuse1_backend_name())


def _copied_from_lazy(destination: torch.Tensor, source: LazyHostTensor) -> torch.Tensor:
    """``destination.copy_(source)`` where only the source is lazy: onto a meta tensor (a mock tensor's payload,
    the mock device's copy from the host) the shapes are checked; an ordinary CPU tensor gets zeros."""
    if destination.is_meta:
        return destination.copy_(source._payload)
    meta_payloads.record("cpu copy")
    return destination.zero_()


def _view_of(storage: torch.UntypedStorage, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s view (offset, shape, strides, dtype) of ``storage`` (a meta one: lazy), a parameter if it is one."""
    device = _META if storage.device.type == "meta" else storage.device
    view = torch.empty(0, dtype=tensor.dtype, device=device).set_(storage, tensor.storage_offset(), tensor.shape, tensor.stride())
    if view.is_meta:
        view = LazyHostTensor.wrap(view)
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(view, requires_grad=tensor.requires_grad)
    return view.requires_grad_() if tensor.requires_grad else view


def set_data(variable: torch.Tensor, data: torch.Tensor) -> None:
    """``variable.data = data`` where either is lazy (see the module docstring)."""
    if isinstance(variable, LazyHostTensor) and isinstance(data, LazyHostTensor):
        with torch._C.DisableTorchFunction():
            _SET_DATA_OF(variable, data)
        variable._payload = data._payload
        return
    swap_in(variable, data)


# -- making them -------------------------------------------------------------------------------------


#: The factories whose CPU results are lazy from the threshold on (the ``*_like`` ones and ``new_*`` on a lazy
#: tensor are lazy by the dispatch rules).
FACTORIES = frozenset({
    torch.empty, torch.zeros, torch.ones, torch.full, torch.rand, torch.randn, torch.randint, torch.randperm,
    torch.arange, torch.linspace, torch.logspace, torch.eye, torch.empty_strided,
    torch.Tensor.new_empty, torch.Tensor.new_zeros, torch.Tensor.new_ones, torch.Tensor.new_full,
})


#: The ``*_like`` factories, whose CPU copy of a meta tensor (``Module.to_empty(device="cpu")`` of a model built on
#: the meta device: FSDP2's CPU offload keeps the shards there) is lazy from the threshold on.
LIKE_FACTORIES = frozenset({torch.empty_like, torch.zeros_like, torch.ones_like, torch.full_like, torch.rand_like,
                            torch.randn_like})


def lazy_factories(func: Callable, args: tuple, kwargs: dict, proceed: Callable) -> Any:
    """A torch-function rule (:func:`simulators.devices.families.tensor.add_function_rule`): makes the factories' large CPU
    results lazy in no-compute mode, and sends ``variable.data = other`` with an ordinary variable and lazy data to
    :func:`set_data` (a lazy variable's own setter takes the others)."""
    if func in FACTORIES:
        if meta_payloads.enabled() and "out" not in kwargs:
            made = _made_lazy(func, args, kwargs)
            if made is not None:
                return made
    elif func in LIKE_FACTORIES and meta_payloads.enabled() and _meta_to_cpu(args[0], kwargs.get("device")):
        return _lazy_like(func, args, kwargs, proceed)
    elif func == _SET_DATA and isinstance(args[1], LazyHostTensor) and not isinstance(args[0], DeviceTensor):
        return set_data(*args)
    return proceed(func, args, kwargs)


def _made_lazy(func: Callable, args: tuple, kwargs: dict) -> LazyHostTensor | None:
    """The lazy result of factory ``func`` when it makes a CPU tensor of at least :func:`threshold` bytes."""
    device = kwargs.get("device")
    if func.__name__.startswith("new_"):  # a method: of an ordinary tensor or a lazy one (others keep their own rules)
        if type(args[0]) not in (torch.Tensor, torch.nn.Parameter, LazyHostTensor):
            return None
        device = args[0].device if device is None else device
    if device is not None and torch.device(device).type != "cpu":
        return None
    probe_kwargs = {key: value for key, value in kwargs.items() if key not in ("generator", "pin_memory")}
    probe_kwargs["device"] = _META
    with torch._C.DisableTorchFunction():
        probe = func(*args, **probe_kwargs)
    if probe.untyped_storage().nbytes() < threshold():
        return None
    return LazyHostTensor.wrap(probe.detach(), requires_grad=probe.requires_grad)


def large_empty(shape: torch.Size, dtype: torch.dtype, requires_grad: bool = False) -> LazyHostTensor | None:
    """A lazy CPU tensor of ``shape`` and ``dtype`` when it would take at least :func:`threshold` bytes, else None."""
    if torch.Size(shape).numel() * dtype.itemsize < threshold():
        return None
    return LazyHostTensor.wrap(torch.empty(shape, dtype=dtype, device=_META), requires_grad=requires_grad)


def _meta_to_cpu(source: Any, device: Any) -> bool:
    """Whether a ``*_like`` factory copies ``source`` to the CPU from no memory: a meta tensor or a mock device's
    (whose payload is meta in no-compute mode), or a DTensor of such a shard."""
    local = getattr(source, "_local_tensor", source)
    return (isinstance(local, torch.Tensor) and (local.is_meta or isinstance(local, DeviceTensor))
            and device is not None and torch.device(device).type == "cpu")


def _lazy_like(func: Callable, args: tuple, kwargs: dict, proceed: Callable) -> Any:
    """``func`` of ``args[0]`` onto the CPU (see `_meta_to_cpu`), lazy when it takes at least :func:`threshold`
    bytes; of a DTensor, a DTensor of the same mesh and placements whose shard is lazy."""
    source = args[0]
    local = getattr(source, "_local_tensor", source)
    with torch._C.DisableTorchFunction():
        lazy = large_empty(local.shape, kwargs.get("dtype") or local.dtype, bool(kwargs.get("requires_grad", False)))
    if lazy is None:
        return proceed(func, args, kwargs)
    if local is source:
        return lazy
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(lazy, source.device_mesh, source.placements, run_check=False, shape=source.shape,
                              stride=source.stride())


def made_lazy(loaded: Any, mapped: bool = False) -> Any:
    """``loaded`` (a ``torch.load`` result: containers of tensors) with each ordinary CPU tensor whose storage has
    at least :func:`threshold` bytes made lazy (tensors of one storage: views of one payload). Where the file was
    ``mapped``, the other storages are copied out of the mapping (which goes with the large tensors), each once."""
    storages: dict[int, torch.UntypedStorage] = {}
    limit = threshold()

    def lazy(tensor: torch.Tensor) -> torch.Tensor:
        if type(tensor) not in (torch.Tensor, torch.nn.Parameter) or tensor.device.type != "cpu" or tensor.layout is not torch.strided:
            return tensor
        storage = tensor.untyped_storage()
        if storage.nbytes() < limit and not mapped:
            return tensor
        key = storage._cdata
        if key not in storages:
            large = storage.nbytes() >= limit
            storages[key] = torch.UntypedStorage(storage.nbytes(), device=_META) if large else storage.clone()
        return _view_of(storages[key], tensor)

    return tree_map_only(torch.Tensor, lazy, loaded)


def _lazy_loading(load: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.load`` that, in no-compute mode, maps a file path instead of reading it and makes the large tensors
    lazy (:func:`made_lazy`)."""

    @functools.wraps(load)
    def loading(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        if not meta_payloads.enabled():
            return load(f, map_location, *args, **kwargs)
        if kwargs.get("mmap") is None and isinstance(f, (str, os.PathLike)):
            try:
                return made_lazy(load(f, map_location, *args, mmap=True, **kwargs), mapped=True)
            except RuntimeError as error:  # a file of torch's legacy format cannot be mapped
                if "mmap can only be used" not in str(error):
                    raise
        return made_lazy(load(f, map_location, *args, **kwargs), mapped=bool(kwargs.get("mmap")))

    return loading


class _LazySafeOpen:
    """safetensors' ``safe_open`` in no-compute mode: a tensor it gives (``get_tensor``, ``get_tensors``, an index of
    a ``get_slice``) of at least :func:`threshold` bytes is lazy, its bytes unread; the rest is the file's."""

    def __init__(self, opened: Any, device: Any) -> None:
        self._opened, self._device = opened, device

    def __enter__(self) -> "_LazySafeOpen":
        self._opened.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._opened.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:  # keys, offset_keys, metadata
        return getattr(self._opened, name)

    def get_slice(self, name: str) -> "_LazySlice":
        return _LazySlice(self._opened.get_slice(name), self._device)

    def get_tensor(self, name: str) -> torch.Tensor:
        lazy = self.get_slice(name).lazy(Ellipsis)
        return lazy if lazy is not None else self._opened.get_tensor(name)

    def get_tensors(self) -> dict[str, torch.Tensor]:
        return {name: self.get_tensor(name) for name in self._opened.offset_keys()}


class _LazySlice:
    """A ``get_slice`` of `_LazySafeOpen`: indexing it reads the file only for a result under the threshold."""

    def __init__(self, part: Any, device: Any) -> None:
        self._part, self._device = part, device

    def __getattr__(self, name: str) -> Any:  # get_shape, get_dtype
        return getattr(self._part, name)

    def lazy(self, index: Any) -> torch.Tensor | None:
        """The lazy tensor ``self[index]`` (on the file's device), or None under the threshold."""
        from safetensors.torch import _getdtype

        whole = torch.empty(self._part.get_shape(), dtype=_getdtype(self._part.get_dtype()), device=_META)
        payload = whole[index]
        if payload.numel() * payload.element_size() < threshold():
            return None
        lazy = LazyHostTensor.wrap(payload if payload.shape == whole.shape else payload.clone())
        device = f"cuda:{self._device}" if isinstance(self._device, int) else self._device
        return lazy if device in (None, "cpu") or torch.device(device).type == "cpu" else lazy.to(device)

    def __getitem__(self, index: Any) -> torch.Tensor:
        lazy = self.lazy(index)
        return lazy if lazy is not None else self._part[index]


def _lazy_safe_open(module: Any) -> None:
    """``safetensors.safe_open`` giving a `_LazySafeOpen` in no-compute mode (``safetensors.torch.load_file`` and
    ``transformers``' ``from_pretrained`` open files with it), the file itself otherwise."""
    opening = module.safe_open

    def safe_open(filename: Any, framework: str, *args: Any, **kwargs: Any) -> Any:
        opened = opening(filename, framework, *args, **kwargs)
        if not meta_payloads.enabled() or framework not in ("pt", "torch"):
            return opened
        return _LazySafeOpen(opened, args[0] if args else kwargs.get("device", "cpu"))

    module.safe_open = safe_open


def installed() -> bool:
    """Whether this process makes lazy host tensors (:func:`install` ran)."""
    return bool(_family)


def install(family: type[DeviceTensor]) -> None:
    """Add `lazy_factories` to the torch-function rules for the process's life (a no-op while no-compute mode is off) and make ``torch.load``
    and safetensors' ``safe_open`` lazy in no-compute mode; ``family``'s device is where ``.to(device)``
    puts a lazy tensor."""
    from simulators.devices.families.import_hooks import after_import

    _family[:] = [family]
    add_function_rule(lazy_factories)
    torch.load = _lazy_loading(torch.load)
    after_import("safetensors", _lazy_safe_open)
