"""`Accelerator(parallelism_config=...)`: the N-D parallelism members of the Accelerator, and the
data-parallel share of a rank under a device mesh (what the data loaders use).

What runs: the data-parallel dimensions (``dp_replicate``, ``dp_shard``).
The configuration's device mesh is built over the world at construction;
the model is trained with DDP over every rank (each rank a data-parallel
rank, as HF 1.15 does without FSDP), or with FSDP (``fsdp_plugin``) when the
plugin's strategy shards over the same ranks as the mesh's FSDP dimensions.
Tensor, context and sequence parallelism (``tp``/``cp``/``sp`` sizes > 1) are
refused by name. Unlike HF 1.15, a multi-process CPU world counts as
multi-device: HF refuses every ParallelismConfig of total size > 1 on
MULTI_CPU unless FSDP2 drives it (its ``multi_device`` leaves the CPU out).
With an FSDP plugin, CPU ranks are judged as GPU ranks under FSDP are.

Mirrors the parallelism members of HF 1.15's ``Accelerator``; no catalog ID covers them yet.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Any, Iterator, Optional

import torch

from ..logging import get_logger
from ..parallelism_config import ParallelismConfig
from ..utils.dataclasses import DistributedType

logger = get_logger("accelerate_ref.accelerator")  # HF 1.15 logs these under its accelerator module


class ParallelismMixin:
    """The `Accelerator`'s parallelism configuration, its device mesh, and this rank's place in it."""

    def _init_parallelism(self, parallelism_config: Optional[ParallelismConfig]) -> None:
        """Build ``parallelism_config``'s device mesh over this world, then validate the configuration.

        Rules (HF 1.15's order and words): without one,
        ACCELERATE_USE_PARALLELISM_CONFIG=true makes a default
        `ParallelismConfig()` (sizes from its environment); tp, cp or sp
        enabled is the reference's NotImplementedError naming them; the mesh
        is built next (`ParallelismConfig.get_device_mesh`: torch refuses
        sizes this world cannot hold), then `_validate_parallelism`.
        """
        if parallelism_config is None and os.environ.get("ACCELERATE_USE_PARALLELISM_CONFIG", "false").lower() == "true":
            parallelism_config = ParallelismConfig()
        self.state.parallelism_config = parallelism_config  # the latest Accelerator's, as the engine plugins
        self.state.device_mesh = None
        if not parallelism_config:
            return
        unsupported = getattr(parallelism_config, "non_dp_dim_names", None)
        if unsupported:
            raise NotImplementedError(
                f"parallelism_config: accelerate_ref runs the data-parallel dimensions (dp_replicate, dp_shard) only; "
                f"{', '.join(unsupported)} > 1 (tensor/context/sequence parallelism) is not provided yet"
            )
        self.state.device_mesh = parallelism_config.get_device_mesh(self.device.type)
        self._validate_parallelism(parallelism_config)

    def _validate_parallelism(self, config: ParallelismConfig) -> None:
        """Check ``config`` against this world, as HF 1.15's ``ParallelismConfig._validate_accelerator``.

        Rules, in HF's order and words: a world of devices is a multi-device
        run (several GPUs, NPUs, ...) or, unlike HF, several CPU ranks
        without an FSDP plugin (see the module docstring: with one, CPU ranks
        are treated as GPU ranks under FSDP, whose distributed type is not
        multi-device). Outside one, a configuration of total size 1
        is left as it is (one process, or FSDP's ranks). In one, it becomes
        pure replication over every rank (``_set_size("dp_replicate",
        num_processes)``, the mesh staying as built, None). Any other total
        size must equal num_processes (ValueError). FSDP 2 needs a dimension
        to shard across, dp_shard or cp (ValueError); a configuration of
        several ranks needs FSDP 2, a world of devices or DeepSpeed
        (ValueError naming the distributed type: FSDP 1, XLA). A handler
        given for a dimension of size 1 is ignored, with a UserWarning from
        the main process.
        """
        cpu_ranks = self.distributed_type == DistributedType.MULTI_CPU and self._engines.fsdp_plugin is None
        devices = self.multi_device or cpu_ranks
        if not devices and config.total_size == 1:
            return
        if config.total_size == 1:
            config._set_size("dp_replicate", self.num_processes)
        if config.total_size != self.num_processes:
            raise ValueError(
                f"ParallelismConfig total_size ({config.total_size}) does not match num_processes "
                f"({self.num_processes}). Please adjust dp_replicate_size/ dp_shard_size/tp_size/cp_size/sp_size."
            )
        if self.is_fsdp2 and not config.dp_shard_enabled and not config.cp_enabled:
            raise ValueError(
                "FSDP is enabled but the parallelism config has no dimension for FSDP to shard across (both "
                "`dp_shard_size` and `cp_size` are 1). This usually means a model that is already parallelized another "
                "way -- e.g. loaded with `DistributedConfig(tp_size=N)` or `enable_expert_parallel=True`, which makes "
                "the whole world size tensor/expert parallel -- was launched under an FSDP config. Either launch it "
                "without the FSDP config, or leave ranks for FSDP to use by lowering `tp_size`."
            )
        if config.total_size > 1 and not (self.is_fsdp2 or devices or self.distributed_type == DistributedType.DEEPSPEED):
            raise ValueError(
                "ParallelismConfig is only compatible DistributedType.FSDP (version 2) or DistributedType.Multi{Device} "
                f"or DistributedType.DEEPSPEED, but got {self.distributed_type}."
            )
        ignored = {f"ParallelismConfig.{name}_handler is set, but {name}_size is set to 1. "
                   "This handler will be ignored."
                   for name, size in config._sizes.items()
                   if size == 1 and getattr(config, f"{name}_handler", None) is not None}
        if ignored and self.is_main_process:
            warnings.warn("ParallelismConfig has the following warnings:\n" + "\n".join(ignored), UserWarning)

    @property
    def parallelism_config(self) -> Optional[ParallelismConfig]:
        """The `ParallelismConfig` this Accelerator runs (None without one)."""
        return self.state.parallelism_config

    @property
    def torch_device_mesh(self) -> Any:
        """The configuration's `DeviceMesh` (None without a configuration or with no dimension enabled)."""
        return self.state.device_mesh

    @property
    def is_composable_parallelism_enabled(self) -> bool:
        """True when FSDP version 2 (torch's ``fully_shard``) shards the model across several processes."""
        plugin = self._engines.fsdp_plugin
        return self.use_distributed and plugin is not None and plugin.fsdp_version == 2

    def _mesh_rank(self, dimension: str, what: str) -> int:
        """This rank's index along ``dimension`` of the mesh; 0 when the dimension is off (all ranks alike).

        RuntimeError without a configuration (HF's words).
        """
        config = self.parallelism_config
        if not config:
            raise RuntimeError(f"{what} is not configured. Set `parallelism_config` first.")
        return self.torch_device_mesh.get_local_rank(dimension) if getattr(config, f"{dimension}_enabled") else 0

    @property
    def tensor_parallel_rank(self) -> int:
        """This rank's tensor-parallel index (0 when tp is off); RuntimeError without a configuration."""
        return self._mesh_rank("tp", "Tensor parallelism")

    @property
    def data_parallel_rank(self) -> int:
        """This rank's index along ``dp_replicate`` (0 when off); RuntimeError without a configuration."""
        return self._mesh_rank("dp_replicate", "Data parallelism")

    @property
    def data_parallel_shard_rank(self) -> int:
        """This rank's index along ``dp_shard`` (0 when off); RuntimeError without a configuration."""
        return self._mesh_rank("dp_shard", "Shard-based data parallelism")

    @property
    def pipeline_parallel_rank(self) -> int:
        """Always NotImplementedError: pipeline parallelism is not part of a `ParallelismConfig` (HF 1.15)."""
        raise NotImplementedError("Pipeline parallelism is currently not supported in Accelerate.")

    @property
    def context_parallel_rank(self) -> int:
        """Always NotImplementedError, as HF 1.15 (which has no context-parallel rank either)."""
        raise NotImplementedError("Context parallelism is currently not supported in Accelerate.")

    @contextlib.contextmanager
    def maybe_context_parallel(
        self,
        buffers: Optional[list[torch.Tensor]] = None,
        buffer_seq_dims: Optional[list[int]] = None,
        no_restore_buffers: Optional[set[torch.Tensor]] = None,
    ) -> Iterator[None]:
        """Shard ``buffers`` along their sequence dimensions for context parallelism inside the block.

        Rule (HF 1.15): where context parallelism is off (cp_size 1, or no
        configuration) it changes nothing, warns once, and does not raise, so
        a script keeps one code path. Context parallelism itself is refused at
        construction here, so this is always the no-op.
        """
        logger.warning_once(
            "Context parallel training is not enabled. This context manager will have no effect. "
            "To enable it, set `parallelism_config.cp_size` > 1 in the `Accelerator` constructor."
        )
        yield


def data_parallel_share(mesh: Any, num_processes: int, process_index: int) -> tuple[int, int]:
    """(number of data-parallel shares, this rank's share): the process's own without a ``mesh``.

    Rule (HF 1.15's `prepare_data_loader`): under a mesh, ranks that differ
    only along ``tp`` or ``cp`` read the same batches: the share is
    ``process_index // (tp x cp)`` and the count ``dp_replicate x dp_shard``
    (1 for a dimension the mesh lacks). (HF's DeepSpeed variant, ``// tp`` of
    both, needs DeepSpeed as the distributed type, which accelerate_ref never
    sets.) `DataLoaderDispatcher` slices by the same shares; HF 1.15's gives
    every rank the same batch under a tp mesh, whatever its dp dimensions, and
    slices ``split_batches`` per process even under tp.
    """
    if mesh is None:
        return num_processes, process_index
    names = mesh.mesh_dim_names or ()

    def size(name: str) -> int:
        return mesh[name].size() if name in names else 1

    return size("dp_replicate") * size("dp_shard"), process_index // (size("tp") * size("cp"))
