"""`ParallelismConfig`: the sizes of the N-D parallel dimensions and the device mesh they make.

Five dimensions, each of a size >= 1 (1: off): ``dp_replicate`` (data
parallel, model replicated), ``dp_shard`` (data parallel, model sharded:
FSDP; with ``dp_replicate`` HSDP), ``tp`` (tensor parallel), ``cp`` (context
parallel, torch backend), ``sp`` (sequence parallel, DeepSpeed's Ulysses).
The enabled ones make a `torch.distributed.device_mesh.DeviceMesh`, in the
order dp_replicate, dp_shard, cp, sp, tp (the last varies fastest over
ranks), with the joint dimensions ``dp`` (dp_replicate x dp_shard),
``dp_shard_cp`` (the ranks FSDP shards over) and ``dp_cp`` (the ranks a
loss is averaged over) flattened from it. Ranks that differ only in the
non-data-parallel dimensions (tp, cp, sp) see the same batches.

`Accelerator(parallelism_config=...)` uses it through `accelerate_ref._accelerator.parallelism`.
Mirrors HF 1.15's ``accelerate.parallelism_config``; no catalog ID covers it yet.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

from .utils.dataclasses import TorchContextParallelConfig, TorchTensorParallelConfig

#: The dimensions in the constructor's order.
DIMENSIONS = ("dp_replicate", "dp_shard", "tp", "cp", "sp")
#: The dimensions in mesh order; the first two are data parallel.
MESH_ORDER = ("dp_replicate", "dp_shard", "cp", "sp", "tp")
#: Valid backends of context and sequence parallelism (HF 1.15's).
CP_BACKENDS = ("torch",)
SP_BACKENDS = ("deepspeed",)


@dataclass
class ParallelismConfig:
    """Sizes of the parallel dimensions, their handlers, and the device mesh built from them.

    Rules (HF 1.15): a size left None comes from PARALLELISM_CONFIG_<NAME>_SIZE
    (else 1), ``cp_backend`` from PARALLELISM_CONFIG_CP_BACKEND (else
    "torch"), ``sp_backend`` from PARALLELISM_CONFIG_SP_BACKEND (else
    "deepspeed"). A size below 1 or an unknown backend is a ValueError naming
    it; cp and sp together are a ValueError (mutually exclusive); so is tp or
    cp with pure replication (dp_replicate > 1, dp_shard == 1). An enabled tp,
    cp or sp gets a default handler (`TorchTensorParallelConfig`,
    `TorchContextParallelConfig`, DeepSpeedSequenceParallelConfig) when none is
    given; a cp handler that is not the backend's class is a ValueError (a
    KeyError naming an unknown backend).
    ``device_mesh`` is None until `get_device_mesh` builds it; ``_sizes`` holds
    the sizes as validated (see `_set_size`).
    """

    dp_replicate_size: Optional[int] = None
    dp_shard_size: Optional[int] = None
    tp_size: Optional[int] = None
    cp_size: Optional[int] = None
    cp_backend: Literal["torch"] = None
    sp_size: Optional[int] = None
    sp_backend: Literal["deepspeed"] = None
    tp_handler: Union[None, TorchTensorParallelConfig] = None
    cp_handler: Union[None, TorchContextParallelConfig] = None
    sp_handler: Any = None

    #: The mesh `get_device_mesh` built (a class-level None until then, as HF's; not a field).
    device_mesh = None

    def __post_init__(self) -> None:
        for name in DIMENSIONS:
            if getattr(self, f"{name}_size") is None:
                setattr(self, f"{name}_size", int(os.environ.get(f"PARALLELISM_CONFIG_{name.upper()}_SIZE", "1")))
        if self.cp_backend is None:
            self.cp_backend = os.environ.get("PARALLELISM_CONFIG_CP_BACKEND", "torch")
        if self.sp_backend is None:
            self.sp_backend = os.environ.get("PARALLELISM_CONFIG_SP_BACKEND", "deepspeed")
        self._default_handlers()
        for name in ("dp_replicate", "dp_shard", "tp", "cp"):
            if getattr(self, f"{name}_size") < 1:
                raise ValueError(f"{name}_size must be at least 1, but got {getattr(self, f'{name}_size')}")
        if self.cp_backend not in CP_BACKENDS:
            raise ValueError(f"cp_backend must be one of {list(CP_BACKENDS)}, but got {self.cp_backend}")
        if self.sp_size < 1:
            raise ValueError(f"sp_size must be at least 1, but got {self.sp_size}")
        if self.sp_backend not in SP_BACKENDS:
            raise ValueError(f"sp_backend must be one of {list(SP_BACKENDS)}, but got {self.sp_backend}")
        if self.cp_enabled and self.sp_enabled:
            raise ValueError(
                "Context Parallelism (CP) and Sequence Parallelism (SP) are mutually exclusive. "
                f"Got cp_size={self.cp_size} and sp_size={self.sp_size}. Please set either cp_size=1 or sp_size=1."
            )
        if (self.tp_enabled or self.cp_enabled) and self.dp_replicate_enabled and not self.dp_shard_enabled:
            raise ValueError(
                "Tensor/Context parallelism (tp/cp_size > 1) cannot be used with pure data parallelism "
                "(dp_replicate_size > 1 and dp_shard_size == 1). Please set dp_shard_size > 1 and "
                "dp_replicate_size == 1 to compose FSDP + TP/CP for 2D parallel, or set dp_replicate_size == 1 "
                "and dp_shard_size > 1 to compose HSDP + TP/CP for 3D parallel."
            )
        self._sizes: dict[str, int] = {name: getattr(self, f"{name}_size") for name in DIMENSIONS}

    def __repr__(self) -> str:
        """HF 1.15's layout: one field per line, total_size included, the sp handler left out."""
        return (
            f"ParallelismConfig(\n \tdp_replicate_size={self.dp_replicate_size},\n\tdp_shard_size={self.dp_shard_size},"
            f"\n\ttp_size={self.tp_size},\n\tcp_size={self.cp_size},\n\tcp_backend={self.cp_backend},"
            f"\n\tsp_size={self.sp_size},\n\tsp_backend={self.sp_backend},\n\ttotal_size={self.total_size}"
            f"\n\ttp_handler={self.tp_handler},\n\tcp_handler={self.cp_handler})\n"
        )

    def _default_handlers(self) -> None:
        """Give an enabled tp, cp or sp its default handler; check a given cp handler's class."""
        if self.tp_size > 1 and self.tp_handler is None:
            self.tp_handler = TorchTensorParallelConfig()
        if self.cp_size > 1:
            if self.cp_handler is None:
                self.cp_handler = TorchContextParallelConfig()
            else:
                handler_class = {"torch": TorchContextParallelConfig}[self.cp_backend]  # HF: a KeyError for another
                if not isinstance(self.cp_handler, handler_class):
                    raise ValueError(
                        f"ParallelismConfig's cp_backend={self.cp_backend} requires {handler_class}, "
                        f"but cp_handler was set to {type(self.cp_handler)}"
                    )
        if self.sp_size > 1 and self.sp_handler is None:
            from .utils.dataclasses import DeepSpeedSequenceParallelConfig

            self.sp_handler = DeepSpeedSequenceParallelConfig()

    # -- sizes ------------------------------------------------------------

    def _set_size(self, parallelism: str, size: int) -> None:
        """Set one dimension's size, in its field and in the sizes `_get_mesh` reads (`_sizes`).

        Rule (HF 1.15): ``_sizes`` is the sizes as validated at construction; a
        field assigned afterwards changes the enabled dimensions and
        ``total_size`` but not the sizes `_get_mesh` gives them; this changes
        both. An unknown dimension is an AssertionError naming the known ones.
        """
        if parallelism not in self._sizes:
            raise AssertionError(f"Parallelism must be one of {self._sizes.keys()}")
        self._sizes[parallelism] = size
        setattr(self, f"{parallelism}_size", size)

    @property
    def total_size(self) -> int:
        """The product of every dimension's size: the ranks the configuration needs."""
        return self.data_parallel_size * self.non_data_parallel_size

    @property
    def non_data_parallel_size(self) -> int:
        """tp x cp x sp: the ranks that share each batch."""
        return self.tp_size * self.cp_size * self.sp_size

    @property
    def data_parallel_size(self) -> int:
        """dp_replicate x dp_shard: how many different batches one step takes."""
        return self.dp_replicate_size * self.dp_shard_size

    @property
    def dp_replicate_enabled(self) -> bool:
        return self.dp_replicate_size > 1

    @property
    def dp_shard_enabled(self) -> bool:
        return self.dp_shard_size > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp_size > 1

    @property
    def cp_enabled(self) -> bool:
        return self.cp_size > 1

    @property
    def sp_enabled(self) -> bool:
        return self.sp_size > 1

    # -- dimension names ----------------------------------------------------

    def _enabled(self, *names: str) -> list[str]:
        """``names`` whose size field is above 1, in the order given."""
        return [name for name in names if getattr(self, f"{name}_size") > 1]

    @property
    def dp_dim_names(self) -> list[str]:
        """Enabled data-parallel dimensions (dp_replicate, dp_shard)."""
        return self._enabled("dp_replicate", "dp_shard")

    @property
    def non_dp_dim_names(self) -> list[str]:
        """Enabled dimensions whose ranks get the same batch (tp, cp, sp)."""
        return self._enabled("tp", "cp", "sp")

    @property
    def dp_shard_cp_dim_names(self) -> list[str]:
        """Enabled dimensions flattened into the one FSDP shards the model over (dp_shard, cp)."""
        return self._enabled("dp_shard", "cp")

    @property
    def dp_cp_dim_names(self) -> list[str]:
        """Enabled dimensions a loss is averaged over (dp_replicate, dp_shard, cp)."""
        return self._enabled("dp_replicate", "dp_shard", "cp")

    @property
    def fsdp_dim_names(self) -> list[str]:
        """The mesh dimensions FSDP applies over: dp_replicate when enabled, then dp_shard_cp."""
        return self._enabled("dp_replicate") + ["dp_shard_cp"]

    @property
    def active_mesh_dims(self) -> list[str]:
        """Every enabled dimension: the data-parallel ones, then the others."""
        return self.dp_dim_names + self.non_dp_dim_names

    # -- the device mesh --------------------------------------------------------

    def _get_mesh(self) -> tuple[tuple[str, ...], tuple[int, ...]] | tuple[()]:
        """(dimension names, sizes) of the enabled dimensions in mesh order; () when none is enabled.

        The dimensions enabled are read from the size fields, their sizes from ``_sizes`` (see `_set_size`).
        """
        names = tuple(name for name in MESH_ORDER if name in self.active_mesh_dims)
        return (names, tuple(self._sizes[name] for name in names)) if names else ()

    def build_device_mesh(self, device_type: str) -> Any:
        """A `DeviceMesh` over the enabled dimensions on ``device_type``, with ``dp``, ``dp_shard_cp`` and
        ``dp_cp`` flattened from it where their dimensions are enabled; None when no dimension is
        enabled, or when DeepSpeed runs sequence parallelism (it makes its own groups).

        Types (HF 1.15): ``init_device_mesh`` gets the shape and the dimension names as tuples
        (`_get_mesh`), and each joint dimension is flattened from ``mesh[names]`` with ``names``
        the list its ``*_dim_names`` property returns (``mesh[["dp_replicate", "dp_shard"]]``).

        Rule: every rank of the default process group calls it (it creates
        subgroups); the world size must equal `total_size` (torch raises otherwise).
        """
        if self.sp_backend == "deepspeed" and self.sp_enabled:
            return None
        mesh = self._get_mesh()
        if not mesh:
            return None
        from torch.distributed.device_mesh import init_device_mesh

        names, shape = mesh
        device_mesh = init_device_mesh(device_type, shape, mesh_dim_names=names)
        for joint, dims in (("dp", self.dp_dim_names), ("dp_shard_cp", self.dp_shard_cp_dim_names), ("dp_cp", self.dp_cp_dim_names)):
            if dims:
                device_mesh[dims]._flatten(joint)  # the list of names itself, as HF 1.15 indexes it
        return device_mesh

    def get_device_mesh(self, device_type: Optional[str] = None) -> Any:
        """The mesh, built on ``device_type`` on first call.

        Rules: without a mesh yet, ``device_type`` is required (ValueError);
        with one, a different ``device_type`` is a ValueError naming both.
        """
        if self.device_mesh is None:
            if device_type is None:
                raise ValueError("You need to pass a device_type e.g cuda to build the device mesh")
            self.device_mesh = self.build_device_mesh(device_type)
        elif device_type is not None and self.device_mesh.device_type != device_type:
            raise ValueError(
                f"The device_mesh is already created with device type {self.device_mesh.device_type}. However, you "
                f"are trying to get a device mesh with device_type {device_type}. Please check if you correctly "
                "initialized your device_mesh"
            )
        return self.device_mesh

    def to_json(self) -> dict[str, Any]:
        """A deep copy of the fields (handlers as their field dicts), without the device mesh.

        HF 1.15 builds the same copy and returns None (its ``return`` is
        missing); this returns the copy.
        """
        return {
            name: copy.deepcopy(value.__dict__ if hasattr(value, "__dict__") else value)
            for name, value in self.__dict__.items()
            if name != "device_mesh"
        }
