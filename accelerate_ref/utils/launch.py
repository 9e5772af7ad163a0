"""The environment and command lines the launcher gives its ranks (🤗 Accelerate's ``utils.launch``).

The variables are the ones 🤗 Accelerate's own launcher sets, so a script written
for it runs unchanged under ``accelerate-ref launch`` (catalog ``launch.cli``):
``ACCELERATE_USE_CPU``, ``ACCELERATE_MIXED_PRECISION``, ``ACCELERATE_DEBUG_MODE``,
``ACCELERATE_DYNAMO_*``, ``ACCELERATE_GRADIENT_ACCUMULATION_STEPS``, and the
rendezvous address ``MASTER_ADDR`` / ``MASTER_PORT``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import warnings
from shutil import which

from .constants import DEEPSPEED_MULTINODE_LAUNCHERS  # noqa: F401  (HF's utils.launch exposes it)
from .dataclasses import DistributedType, DynamoBackend, PrecisionType
from ._other.ports import get_free_port, is_port_in_use  # noqa: F401
from .versions import compare_versions

LOOPBACK = "127.0.0.1"


def _precision(value: str | None) -> str:
    value = (value or "no").lower()
    try:
        return str(PrecisionType(value).value)
    except ValueError:
        if value == "fp8":
            return value
        raise ValueError(f"unknown mixed_precision {value!r}; choose one of no, fp16, bf16, fp8") from None


def _dynamo(value: str | None) -> str:
    try:
        return DynamoBackend((value or "no").upper()).value
    except ValueError:
        raise ValueError(f"unknown dynamo_backend {value!r}") from None


def launch_env(args: argparse.Namespace, base: dict[str, str] | None = None) -> dict[str, str]:
    """The ``ACCELERATE_*`` variables every rank gets, on top of ``base`` (default: this process's environment)."""
    env = dict(os.environ if base is None else base)
    env["ACCELERATE_USE_CPU"] = str(bool(getattr(args, "cpu", False) or getattr(args, "use_cpu", False)))
    env["ACCELERATE_MIXED_PRECISION"] = _precision(getattr(args, "mixed_precision", None))
    env["ACCELERATE_DYNAMO_BACKEND"] = _dynamo(getattr(args, "dynamo_backend", None))
    env["ACCELERATE_DYNAMO_MODE"] = getattr(args, "dynamo_mode", None) or "default"
    env["ACCELERATE_DYNAMO_USE_FULLGRAPH"] = str(bool(getattr(args, "dynamo_use_fullgraph", False)))
    env["ACCELERATE_DYNAMO_USE_DYNAMIC"] = str(bool(getattr(args, "dynamo_use_dynamic", False)))
    env["ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"] = "False"
    if getattr(args, "debug", False):
        env["ACCELERATE_DEBUG_MODE"] = "true"
    if getattr(args, "gradient_accumulation_steps", None) is not None:
        env["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] = str(args.gradient_accumulation_steps)
    gpu_ids = getattr(args, "gpu_ids", None)
    if gpu_ids not in (None, "all"):
        env["CUDA_VISIBLE_DEVICES"] = gpu_ids
    if getattr(args, "use_fsdp", False):
        env.update(fsdp_env(args))
    if getattr(args, "use_deepspeed", False):
        env.update(deepspeed_env(args))
    if getattr(args, "use_parallelism_config", False):
        prepare_extend_env_parallelism_config(args, env)
    return env


#: FSDP launch options -> (the variable that carries each to the ranks, lower-cased, left out when None), in the
#: order and spelling of 🤗 Accelerate's ``prepare_multi_gpu_env``.
_FSDP_ENV = (
    ("fsdp_sharding_strategy", "FSDP_SHARDING_STRATEGY", False, False),
    ("fsdp_reshard_after_forward", "FSDP_RESHARD_AFTER_FORWARD", True, False),
    ("fsdp_offload_params", "FSDP_OFFLOAD_PARAMS", True, False),
    ("fsdp_min_num_params", "FSDP_MIN_NUM_PARAMS", False, False),
    ("fsdp_auto_wrap_policy", "FSDP_AUTO_WRAP_POLICY", False, True),
    ("fsdp_transformer_layer_cls_to_wrap", "FSDP_TRANSFORMER_CLS_TO_WRAP", False, True),
    ("fsdp_backward_prefetch", "FSDP_BACKWARD_PREFETCH", False, True),
    ("fsdp_state_dict_type", "FSDP_STATE_DICT_TYPE", False, True),
    ("fsdp_forward_prefetch", "FSDP_FORWARD_PREFETCH", True, False),
    ("fsdp_use_orig_params", "FSDP_USE_ORIG_PARAMS", True, False),
    ("fsdp_cpu_ram_efficient_loading", "FSDP_CPU_RAM_EFFICIENT_LOADING", True, False),
    ("fsdp_sync_module_states", "FSDP_SYNC_MODULE_STATES", True, False),
    ("fsdp_activation_checkpointing", "FSDP_ACTIVATION_CHECKPOINTING", True, False),
    ("fsdp_activation_checkpointing_offload", "FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD", True, False),
    ("fsdp_ignored_modules", "FSDP_IGNORED_MODULES", False, True),
)


def fsdp_env(args: argparse.Namespace) -> dict[str, str]:
    """The variables that make the ranks' ``FullyShardedDataParallelPlugin()`` read the ``fsdp_*`` launch options
    (``ACCELERATE_USE_FSDP``, ``FSDP_VERSION``, ...), as 🤗 Accelerate's launch sets them.

    Raises ValueError for CPU-RAM-efficient loading without syncing module states, as HF does."""
    if getattr(args, "fsdp_cpu_ram_efficient_loading", False) and not getattr(args, "fsdp_sync_module_states", True):
        raise ValueError("When using `--fsdp_cpu_ram_efficient_loading` set `--fsdp_sync_module_states` to `True`")
    env = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": str(getattr(args, "fsdp_version", "1"))}
    for option, variable, lowered, optional in _FSDP_ENV:
        value = getattr(args, option, None)
        if value is None and optional:
            continue
        env[variable] = str(value).lower() if lowered else str(value)
    return env


#: The MPI launchers looked for, in order of preference (🤗 Accelerate's).
MPI_APPS = ("mpirun", "mpiexec")


def _get_mpirun_args() -> tuple[str, str, str, str, str]:
    """The MPI launcher found on ``PATH`` and its option names: ``(program, hostfile, process count, processes
    per node, bind-to)``.

    Rules (HF 1.15): the first of ``MPI_APPS`` that ``which`` finds (none: OSError); its ``--version`` output
    (``subprocess.check_output``) naming "Open MPI" gives Open MPI's options (``--hostfile``, ``-n``,
    ``--npernode``, ``--bind-to``), anything else Intel MPI's and MVAPICH's (``-f``, ``-n``, ``-ppn``, no
    bind-to: ""). Both are looked up in this module, so a test can patch ``utils.launch.which`` and
    ``utils.launch.subprocess.check_output``.
    """
    found = [app for app in MPI_APPS if which(app)]
    if not found:
        raise OSError("mpirun or mpiexec were not found. Ensure that Intel MPI, Open MPI, or MVAPICH are installed.")
    if b"Open MPI" in subprocess.check_output([found[0], "--version"]):
        return found[0], "--hostfile", "-n", "--npernode", "--bind-to"
    return found[0], "-f", "-n", "-ppn", ""


def _mpirun_prefix(args: argparse.Namespace) -> list[str]:
    """The MPI launcher's part of a simple launch's command when ``args.mpirun_hostfile`` is set, else [].

    HF 1.15's layout: ``<app> <hostfile option> <hostfile> <per-node option> <processes // machines, or 1>``, then
    ``<count option> <processes>`` when a process count is set, then ``<bind-to option> socket`` when the launcher
    has one.
    """
    hostfile = getattr(args, "mpirun_hostfile", None)
    if hostfile is None:
        return []
    app, hostfile_option, count_option, per_node_option, bind_to_option = _get_mpirun_args()
    num_processes, num_machines = getattr(args, "num_processes", None), getattr(args, "num_machines", None)
    per_node = str(num_processes // num_machines) if num_processes and num_machines else "1"
    prefix = [app, hostfile_option, hostfile, per_node_option, per_node]
    if num_processes:
        prefix += [count_option, str(num_processes)]
    if bind_to_option:
        prefix += [bind_to_option, "socket"]  # HF reads getattr(args, "bind-to", "socket"): no option sets it
    return prefix


def prepare_simple_launcher_cmd_env(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """One process: the command (``python [-m] script args``) and its environment.

    With ``mpirun_hostfile`` set, the command starts with the MPI launcher's (`_mpirun_prefix`). With more than one
    machine, ``main_process_ip`` and ``main_process_port`` are required.
    """
    if getattr(args, "module", False) and getattr(args, "no_python", False):
        raise ValueError("--module and --no_python cannot be used together")
    cmd = _mpirun_prefix(args)
    if not getattr(args, "no_python", False):
        cmd += [sys.executable] + (["-m"] if getattr(args, "module", False) else [])
    cmd += [args.training_script, *args.training_script_args]
    env = launch_env(args)
    num_machines = getattr(args, "num_machines", None) or 1
    if num_machines > 1 and (args.main_process_ip is None or args.main_process_port is None):
        raise ValueError("with several machines, --main_process_ip and --main_process_port are required")
    if (getattr(args, "num_processes", None) or 1) > 1 or num_machines > 1:
        env["MASTER_ADDR"] = args.main_process_ip or LOOPBACK
        env["MASTER_PORT"] = str(args.main_process_port or 29500)
    return cmd, env


def prepare_multi_gpu_env(args: argparse.Namespace) -> dict[str, str]:
    """The environment for a ``torch.distributed.run`` launch; fills ``args.nproc_per_node``,
    ``args.nnodes``, ``args.node_rank``, ``args.master_addr``, ``args.master_port`` for its command line.

    ``main_process_port`` None or 0 picks a free port (one machine only: other machines must be told it).
    """
    num_machines = getattr(args, "num_machines", None) or 1
    num_processes = args.num_processes
    if num_processes % num_machines:
        raise ValueError(f"--num_processes {num_processes} is not a multiple of --num_machines {num_machines}")
    args.nproc_per_node = str(num_processes // num_machines)
    args.nnodes = str(num_machines)
    args.node_rank = int(getattr(args, "machine_rank", 0) or 0)
    args.master_addr = args.main_process_ip or LOOPBACK
    if not args.main_process_port:
        if num_machines > 1:
            raise ValueError("with several machines, --main_process_port is required")
        args.main_process_port = get_free_port()
    args.master_port = str(args.main_process_port)
    env = launch_env(args)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def env_var_path_add(env_var_name, path_to_add):
    """``$env_var_name`` (a ``:``-separated path list, empty entries dropped) with ``path_to_add`` appended;
    the caller sets it."""
    paths = [path for path in os.environ.get(env_var_name, "").split(":") if path]
    return ":".join([*paths, str(path_to_add)])


def setup_fp8_env(args: argparse.Namespace, current_env: dict[str, str]):
    """Copy every ``fp8_*`` launch option that is set into ``current_env`` as ``ACCELERATE_FP8_*``;
    ``fp8_override_linear_precision`` (three values) becomes ``ACCELERATE_FP8_OVERRIDE_{FPROP,DGRAD,WGRAD}``."""
    for name, value in vars(args).items():
        if not name.startswith("fp8_") or value is None:
            continue
        if name == "fp8_override_linear_precision":
            for part, item in zip(("FPROP", "DGRAD", "WGRAD"), value):
                current_env[f"ACCELERATE_FP8_OVERRIDE_{part}"] = str(item)
        else:
            current_env[f"ACCELERATE_{name.upper()}"] = str(value)
    return current_env


def prepare_extend_env_parallelism_config(args: argparse.Namespace, current_env: dict) -> tuple[list[str], dict[str, str]]:
    """Add the ``PARALLELISM_CONFIG_*`` variables of the ``parallelism_config_*`` launch options to
    ``current_env`` (and return it): the sizes and backends always, the context-parallel strategy when
    ``cp_size > 1``, the sequence-parallel details when ``sp_size > 1``."""
    prefix = "PARALLELISM_CONFIG_"
    current_env["ACCELERATE_USE_PARALLELISM_CONFIG"] = "true"
    always = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "cp_backend", "sp_size", "sp_backend")
    chosen = list(always)
    if args.parallelism_config_cp_size > 1:
        chosen.append("cp_comm_strategy")
    if args.parallelism_config_sp_size > 1:
        chosen += ["sp_seq_length", "sp_seq_length_is_variable", "sp_attn_implementation"]
    for name in chosen:
        current_env[prefix + name.upper()] = str(getattr(args, f"parallelism_config_{name}"))
    return current_env


def _default_port(args: argparse.Namespace) -> None:
    """``main_process_port`` 0 picks a free port, None means 29500 (🤗 Accelerate's launchers)."""
    if args.main_process_port == 0:
        args.main_process_port = get_free_port()
    elif args.main_process_port is None:
        args.main_process_port = 29500


def _torchrun_topology(args: argparse.Namespace) -> None:
    """Fill torchrun's ``nproc_per_node``/``nnodes``/``node_rank`` and the rendezvous address on ``args``."""
    if args.num_machines > 1:
        args.nproc_per_node = str(args.num_processes // args.num_machines)
        args.nnodes = str(args.num_machines)
        args.node_rank = int(args.machine_rank)
        if getattr(args, "same_network", False):
            args.master_addr, args.master_port = str(args.main_process_ip), str(args.main_process_port)
        else:
            args.rdzv_endpoint = f"{args.main_process_ip}:{args.main_process_port}"
    else:
        args.nproc_per_node = str(args.num_processes)
        if args.main_process_port is not None:
            args.master_port = str(args.main_process_port)


def _check_port(args: argparse.Namespace) -> None:
    """On machine 0, a taken port means torchrun's standalone mode (one machine) or a ConnectionError."""
    if args.num_machines > 1 and int(args.machine_rank) != 0:
        return
    if not is_port_in_use(args.main_process_port):
        return
    if args.num_machines <= 1:
        args.standalone = True
        warnings.warn(f"Port `{args.main_process_port}` is already in use: launching in standalone mode on a free port.")
    else:
        raise ConnectionError(f"port {args.main_process_port} is already in use: pass another --main_process_port")


def _deepspeed_runner_cmd(args: argparse.Namespace) -> list[str]:
    """The ``deepspeed`` runner's command line for a multi-machine launch through pdsh, MPI, slurm or nossh."""
    cmd = ["deepspeed", "--hostfile", str(args.deepspeed_hostfile)]
    if args.deepspeed_multinode_launcher == "nossh":
        if compare_versions("deepspeed", "<", "0.14.5"):
            raise ValueError("nossh launcher requires DeepSpeed >= 0.14.5")
        cmd += ["--node_rank", str(args.machine_rank), "--no_ssh"]
    else:
        cmd += ["--no_local_rank", "--launcher", str(args.deepspeed_multinode_launcher)]
    if args.deepspeed_exclusion_filter is not None:
        cmd += ["--exclude", str(args.deepspeed_exclusion_filter)]
    elif args.deepspeed_inclusion_filter is not None:
        cmd += ["--include", str(args.deepspeed_inclusion_filter)]
    else:
        cmd += ["--num_gpus", str(args.num_processes // args.num_machines)]
    if args.main_process_ip:
        cmd += ["--master_addr", str(args.main_process_ip)]
    cmd += ["--master_port", str(args.main_process_port)]
    if args.module and args.no_python:
        raise ValueError("--module and --no_python cannot be used together")
    if args.module:
        cmd.append("--module")
    elif args.no_python:
        cmd.append("--no_python")
    return cmd + [args.training_script, *args.training_script_args]


#: DeepSpeed launch options -> the variable that carries each to the ranks (lower-cased when marked).
_DEEPSPEED_ENV = (
    ("zero_stage", "ACCELERATE_DEEPSPEED_ZERO_STAGE", False),
    ("gradient_accumulation_steps", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS", False),
    ("gradient_clipping", "ACCELERATE_GRADIENT_CLIPPING", True),
    ("offload_optimizer_device", "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", True),
    ("offload_param_device", "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE", True),
    ("zero3_init_flag", "ACCELERATE_DEEPSPEED_ZERO3_INIT", True),
    ("zero3_save_16bit_model", "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL", True),
    ("deepspeed_config_file", "ACCELERATE_DEEPSPEED_CONFIG_FILE", False),
)


def deepspeed_env(args: argparse.Namespace) -> dict[str, str]:
    """The variables that carry a launch's DeepSpeed options to the ranks (``ACCELERATE_USE_DEEPSPEED`` and each
    option that is set), which `DeepSpeedPlugin` reads, as 🤗 Accelerate's ``prepare_deepspeed_cmd_env`` sets them."""
    env = {"ACCELERATE_CONFIG_DS_FIELDS": str(getattr(args, "deepspeed_fields_from_accelerate_config", "")).lower(),
           "ACCELERATE_USE_DEEPSPEED": "true"}
    for option, variable, lower in _DEEPSPEED_ENV:
        value = getattr(args, option, None)
        if value is not None:
            env[variable] = str(value).lower() if lower else str(value)
    if getattr(args, "deepspeed_moe_layer_cls_names", None) is not None:
        env["ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES"] = str(args.deepspeed_moe_layer_cls_names)
    return env


def prepare_deepspeed_cmd_env(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The command and environment of a DeepSpeed launch (🤗 Accelerate's launch options on ``args``).

    Several machines with a launcher other than ``standard`` give the ``deepspeed`` runner's command;
    otherwise the command is None and ``args`` gets torchrun's topology (as ``prepare_multi_gpu_env``).
    The environment carries ``ACCELERATE_USE_DEEPSPEED`` and the DeepSpeed options that are set.
    """
    _default_port(args)
    if args.deepspeed_multinode_launcher is None:
        args.deepspeed_multinode_launcher = DEEPSPEED_MULTINODE_LAUNCHERS[0]
    cmd = None
    if args.num_machines > 1 and args.deepspeed_multinode_launcher != "standard":
        cmd = _deepspeed_runner_cmd(args)
    else:
        _torchrun_topology(args)
    _check_port(args)
    if args.module and args.no_python:
        raise ValueError("--module and --no_python cannot be used together")
    env = os.environ.copy()
    if args.debug:
        env["ACCELERATE_DEBUG_MODE"] = "true"
    gpu_ids = getattr(args, "gpu_ids", "all")
    if gpu_ids not in ("all", None):
        env["CUDA_VISIBLE_DEVICES"] = gpu_ids
    precision = _precision(args.mixed_precision)
    env["PYTHONPATH"] = env_var_path_add("PYTHONPATH", os.path.abspath("."))
    env["ACCELERATE_MIXED_PRECISION"] = precision
    if precision == "fp8":
        _require_fp8()
        env = setup_fp8_env(args, env)
    env.update(deepspeed_env(args))
    if args.enable_cpu_affinity:
        env["ACCELERATE_CPU_AFFINITY"] = "1"
    if args.use_parallelism_config:
        env = prepare_extend_env_parallelism_config(args, env)
    return cmd, env


def _require_fp8() -> None:
    from .imports import is_fp8_available

    if not is_fp8_available():
        raise RuntimeError("FP8 is not available on this machine: install Transformer Engine, MS-AMP or torchao")


def prepare_tpu(args: argparse.Namespace, current_env: dict[str, str], pod: bool = False) -> tuple[argparse.Namespace, dict[str, str]]:
    """The TPU variables: bf16 on a real TPU sets ``XLA_USE_BF16`` (``XLA_DOWNCAST_BF16`` with
    ``downcast_bf16``), ``debug`` sets ``ACCELERATE_DEBUG_MODE``; a pod launch copies ``tpu_vm`` and
    ``tpu_name`` to ``args.vm`` and ``args.tpu``."""
    from .imports import is_torch_xla_available

    if args.mixed_precision == "bf16" and is_torch_xla_available(check_is_tpu=True):
        current_env["XLA_DOWNCAST_BF16" if args.downcast_bf16 else "XLA_USE_BF16"] = "1"
    if args.debug:
        current_env["ACCELERATE_DEBUG_MODE"] = "true"
    if pod:
        args.vm = args.tpu_vm
        args.tpu = args.tpu_name
    return args, current_env


class PrepareForLaunch:
    """``launcher`` wrapped as the per-process entry point of a fork-based launch.

    Called with the process ``index``: a ``debug`` launch joins a gloo group over the file store
    ``ACCELERATE_DEBUG_RDV_FILE``; a multi-device ``distributed_type`` sets ``LOCAL_RANK`` to
    ``index`` and ``RANK`` from ``NPROC`` and ``NODE_RANK``. Then ``FORK_LAUNCHED=1`` and
    ``launcher(*args)``.
    """

    _TORCH_DISTRIBUTED = ("MULTI_GPU", "MULTI_MLU", "MULTI_MUSA", "MULTI_NPU", "MULTI_XPU", "MULTI_CPU", "MULTI_NEURON")

    def __init__(self, launcher, distributed_type="NO", debug=False):
        self.launcher = launcher
        self.distributed_type = DistributedType(distributed_type)
        self.debug = debug

    def __call__(self, index, *args):
        if self.debug:
            import torch.distributed as dist

            world_size = int(os.environ.get("WORLD_SIZE"))
            store = dist.FileStore(os.environ.get("ACCELERATE_DEBUG_RDV_FILE"), world_size)
            dist.init_process_group("gloo", rank=index, store=store, world_size=world_size)
        elif self.distributed_type.value in self._TORCH_DISTRIBUTED:
            os.environ["LOCAL_RANK"] = str(index)
            nproc = int(os.environ.get("NPROC", 1))
            os.environ["RANK"] = str(nproc * int(os.environ.get("NODE_RANK", 0)) + index)
        os.environ["FORK_LAUNCHED"] = str(1)
        self.launcher(*args)
