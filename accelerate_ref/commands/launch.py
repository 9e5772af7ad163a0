"""``accelerate-ref launch``: run a script on N ranks over M machines (catalog "Launching").

Process management and rendezvous are ``torch.distributed.run`` (torchrun's
elastic agent, run in this process): ``--num_processes N`` ranks in all,
``N / M`` per machine, ``--machine_rank`` this machine's index, machine 0
hosting the rendezvous at ``--main_process_ip:--main_process_port``
(``launch.multi_node``). ``--cpu --num_processes N`` starts N gloo ranks
(``launch.cpu_ranks``; 🤗 Accelerate starts one, accelerate issue #2741). One
process on one machine runs the script directly. Flags override the config
file, which overrides the defaults (``launch.cli``). Ranks get 🤗 Accelerate's
environment (``utils.launch``), so its scripts run unchanged. The parser takes
every option of 🤗 Accelerate 1.15's ``launch``, in either spelling, with its
defaults (``_launch.options``); torchrun's own (``--max_restarts``, ``--tee``, ...)
reach torchrun.

Bad input (unknown flag, missing script or module, bad config, machine rank
out of range, port in use, a flag asking for a launcher accelerate-ref lacks:
DeepSpeed, Megatron-LM, a TPU pod, mpirun) is one line on stderr and exit 2;
a config file that is missing or holds unknown keys raises 🤗 Accelerate's
FileNotFoundError / ValueError (one line too on the command line); a failing rank
ends the launch (its traceback first, then one line naming it) with exit 1,
and so does a launch still running after ``--timeout`` seconds; every rank is
stopped before the command returns (``launch.failure``).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..utils.dataclasses import ACCELERATOR_WORLD_TYPES, ComputeEnvironment, DistributedType
from ..utils.environment import get_int_from_env, patch_environment
from ..utils.imports import (
    is_bf16_available,
    is_deepspeed_available,
    is_hpu_available,
    is_mlu_available,
    is_musa_available,
    is_neuron_available,
    is_npu_available,
    is_sdaa_available,
    is_torch_xla_available,
    is_xpu_available,
)
from ..utils.launch import (
    PrepareForLaunch,
    is_port_in_use,
    prepare_deepspeed_cmd_env,
    prepare_multi_gpu_env,
    prepare_simple_launcher_cmd_env,
    prepare_tpu,
)
from ..utils.constants import DEEPSPEED_MULTINODE_LAUNCHERS, TORCH_DYNAMO_MODES  # noqa: F401
from ..utils.environment import check_cuda_p2p_ib_support, str_to_bool  # noqa: F401  (HF's commands.launch exposes them)
from ..utils.imports import is_rich_available, is_sagemaker_available  # noqa: F401  (as above)
from .config.config_args import ConfigError, SageMakerConfig, current_default_config_file, default_config_file, load_config_from_file  # noqa: F401
from .config.config_utils import DYNAMO_BACKENDS  # noqa: F401
from ._launch.options import DESCRIPTION, OWN_GROUP, add_launch_arguments
from .utils import CustomArgumentParser


logger = logging.getLogger(__name__)


class LaunchError(Exception):
    """A launch that cannot start: bad flags, script, config or port (exit 2)."""


class RankFailure(Exception):
    """A launch whose ranks failed or ran past ``--timeout`` (exit 1)."""


#: Settings a flag can give and the config file can default, with their last-resort defaults.
DEFAULTS = {
    "num_processes": 1,
    "num_machines": 1,
    "machine_rank": 0,
    "main_process_ip": None,
    "main_process_port": None,
    "mixed_precision": "no",
    "dynamo_backend": "no",
    "gradient_accumulation_steps": None,
    "gpu_ids": None,
}

#: config ``distributed_type`` -> the launch flag it stands for.
DISTRIBUTED_FLAGS = {"MULTI_GPU": "multi_gpu", "MULTI_NPU": "multi_gpu", "XLA": "tpu", "TPU": "tpu", "MULTI_CPU": "cpu",
                     "FSDP": "use_fsdp", "DEEPSPEED": "use_deepspeed"}

#: Config sections whose keys stand for launch options no flag gave, with the prefix their options have.
SECTION_PREFIXES = {"fsdp_config": "fsdp_", "parallelism_config": "parallelism_config_", "deepspeed_config": ""}

#: 🤗 Accelerate's launch flags that pick a launcher accelerate-ref's ``launch`` does not have -> what it is.
UNSUPPORTED_LAUNCHERS = {
    "use_megatron_lm": ("--use_megatron_lm", "a Megatron-LM launch"),
    "tpu_use_cluster": ("--tpu_cluster", "a TPU pod launch"),
    "mpirun_hostfile": ("--mpirun_hostfile", "an mpirun launch"),
}


#: A launch option -> the help section it reveals (🤗 Accelerate's ``launch --help`` shows only used ones).
options_to_group = {
    "multi_gpu": "Distributed GPUs",
    "tpu": "TPU",
    "use_deepspeed": "DeepSpeed Arguments",
    "use_fsdp": "FSDP Arguments",
    "use_megatron_lm": "Megatron-LM Arguments",
    "fp8_backend": "FP8 Arguments",
}


def clean_option(option):
    """``--some-option`` -> ``some_option`` (any ``fp8_backend`` spelling -> ``fp8_backend``); None for a non-option."""
    if "fp8_backend" in option:
        option = "--fp8_backend"
    if option.startswith("--"):
        return option[2:].replace("-", "_")


class CustomHelpFormatter(argparse.HelpFormatter):
    """Help that hides the option groups the command line does not use, as 🤗 Accelerate's ``launch --help``.

    With more than one argument after ``launch``, options of groups outside the always-shown titles and
    the groups ``options_to_group`` names for the given options are hidden; hyphen spellings are not listed;
    a section left with fewer than two entries is dropped. accelerate-ref's own group is always shown.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.titles = ["Hardware Selection Arguments", "Resource Selection Arguments", "Training Paradigm Arguments",
                       "positional arguments", "optional arguments", OWN_GROUP[0]]

    def add_argument(self, action: argparse.Action):
        given = sys.argv[2:] if "accelerate" in sys.argv[0] and "launch" in sys.argv[1:] else sys.argv[1:]
        if len(given) > 1:
            given = [clean_option(argument) for argument in given]
            shown = self.titles + [options_to_group[option] for option in given if option in options_to_group]
            title = action.container.title
            if title not in shown:
                action.help = argparse.SUPPRESS
            elif title in ("Hardware Selection Arguments", "Training Paradigm Arguments"):
                selected = not set(action.option_strings).isdisjoint(given)
                action.help = action.help + " (currently selected)" if selected else argparse.SUPPRESS
        action.option_strings = [option for option in action.option_strings if "-" not in option[2:]]
        super().add_argument(action)

    def end_section(self):
        if len(self._current_section.items) < 2:
            self._current_section.items = []
            self._current_section.heading = ""
        super().end_section()


def launch_command_parser(subparsers=None):
    """The ``launch`` parser: a subcommand of ``subparsers`` when given, else a ``CustomArgumentParser`` of its own.

    Its options are 🤗 Accelerate 1.15's, then accelerate-ref's own (``_launch.options``); with a
    ``CustomArgumentParser`` (standalone, or under the ``accelerate-ref`` console script) each takes its ``_``
    and ``-`` spellings, and ``launch -h`` lists the ``_`` one alone (``CustomHelpFormatter``).
    """
    settings = {"description": DESCRIPTION, "add_help": False, "allow_abbrev": False, "formatter_class": CustomHelpFormatter}
    if subparsers is not None:
        parser = subparsers.add_parser("launch", help="run a script on several ranks", **settings)
    else:
        parser = CustomArgumentParser("accelerate-ref launch command", **settings)
    add_launch_arguments(parser)
    if subparsers is not None:
        parser.set_defaults(func=launch_command)
    return parser


def _apply_config(args: argparse.Namespace) -> None:
    """Fill what no flag gave from the config file, then from ``DEFAULTS`` (flags win; a flag given is in
    ``args.nondefault``). The config is ``--config_file``, else the default file when there is one; a missing or
    unusable file raises what ``load_config_from_file`` raises (🤗 Accelerate's FileNotFoundError and ValueError)."""
    given = getattr(args, "nondefault", set())
    path = args.config_file
    if path is None and os.path.isfile(current_default_config_file()):
        path = current_default_config_file()
    try:
        config = load_config_from_file(path) if path is not None else None
    except ConfigError as error:  # not YAML or not a mapping: accelerate-ref's own one-line refusal
        raise LaunchError(str(error)) from None
    if isinstance(config, SageMakerConfig):
        raise LaunchError(f"{path} is an Amazon SageMaker config (compute_environment: AMAZON_SAGEMAKER); "
                          "accelerate-ref launches on this host only")
    if config is not None:
        if not (args.cpu or args.multi_gpu or args.tpu or args.use_fsdp or args.use_deepspeed):
            flag = DISTRIBUTED_FLAGS.get(getattr(config.distributed_type, "value", config.distributed_type))
            if flag:
                setattr(args, flag, True)
        args.cpu = args.cpu or bool(config.use_cpu)
        args.debug = args.debug or bool(config.debug)
        if "use_parallelism_config" not in given:
            args.use_parallelism_config = bool(config.parallelism_config)
        _fill_sections(args, config, given)
        # The DeepSpeed settings the config gave, which a DeepSpeed config file may not give again (HF's rule).
        args.deepspeed_fields_from_accelerate_config = ",".join(getattr(config, "deepspeed_config", None) or {})
    args.use_fsdp, args.use_parallelism_config = bool(args.use_fsdp), bool(args.use_parallelism_config)
    for name, default in DEFAULTS.items():
        if getattr(args, name) is None:
            from_config = getattr(config, name, None) if config is not None else None
            if name == "num_processes" and from_config is not None and from_config < 1:
                from_config = None  # ClusterConfig's -1: "not set in the file"
            setattr(args, name, from_config if from_config is not None else default)


def _fill_sections(args: argparse.Namespace, config, given: set[str]) -> None:
    """The options no flag gave (not in ``given``) from the config's ``fsdp_config`` and ``parallelism_config``
    sections (keys with their option prefix, or without it as ``accelerate config`` writes some)."""
    for section, prefix in SECTION_PREFIXES.items():
        for key, value in (getattr(config, section, None) or {}).items():
            option = key if key.startswith(prefix) else prefix + key
            if hasattr(args, option) and option not in given:
                setattr(args, option, value)


#: Flags of 🤗 Accelerate's launch parser that its validation reads and this parser lacks, with their defaults there.
HF_ONLY_FLAG_DEFAULTS = {
    "use_deepspeed": False,
    "use_megatron_lm": False,
    "tpu_use_cluster": False,
    "num_cpu_threads_per_process": None,
}

#: Config ``distributed_type``s that mean one process per accelerator (``--multi_gpu``).
MULTI_DEVICE_TYPES = ACCELERATOR_WORLD_TYPES

#: Accelerator families other than CUDA, as ``(torch attribute, availability check)``, in the order HF asks them.
DEVICE_FAMILIES = (
    ("xpu", is_xpu_available), ("mlu", is_mlu_available), ("sdaa", is_sdaa_available), ("musa", is_musa_available),
    ("npu", is_npu_available), ("hpu", is_hpu_available), ("neuron", is_neuron_available),
)

#: A config section -> (the key prefix its keys already have, the prefix they get as launch flags).
SECTION_FLAG_PREFIXES = {"fsdp_config": ("fsdp", "fsdp_"), "fp8_config": ("fp8", "fp8_"), "dynamo_config": ("dynamo_", "dynamo_")}


def _check_launch_flags(args: argparse.Namespace) -> None:
    """The flag combinations 🤗 Accelerate's launch refuses, as its ValueErrors (one paradigm at a time, ``--multi_gpu``
    with fewer than 2 processes, ``--use_parallelism_config`` without FSDP 2). Flags the namespace lacks are set to
    their defaults in HF's parser (``HF_ONLY_FLAG_DEFAULTS``)."""
    for name, default in HF_ONLY_FLAG_DEFAULTS.items():
        if not hasattr(args, name):
            setattr(args, name, default)
    if sum([args.multi_gpu, args.cpu, args.tpu, args.use_deepspeed, bool(args.use_fsdp)]) > 1:
        raise ValueError(
            "You can only use one of `--cpu`, `--multi_gpu`, `--tpu`, `--use_deepspeed`, `--use_fsdp` at a time."
        )
    if args.multi_gpu and args.num_processes is not None and args.num_processes < 2:
        raise ValueError("You need to use at least 2 processes to use `--multi_gpu`.")
    # HF compares the parser's string "1" with the number 1, so only a missing --use_fsdp refuses here
    if (not args.use_fsdp or args.fsdp_version == 1) and args.use_parallelism_config:
        raise ValueError("You cannot use `--use_parallelism_config` without `--use_fsdp` and `--fsdp_version=2`. ")


def _accelerator_count() -> int:
    """The devices of the first accelerator family found (CUDA last; 0 on a CPU-only machine)."""
    import torch

    for family, available in DEVICE_FAMILIES:
        if available():
            return getattr(torch, family).device_count()
    return torch.cuda.device_count()


def _several_accelerators() -> bool:
    import torch

    return any(available() and getattr(torch, family).device_count() > 1 for family, available in DEVICE_FAMILIES) or (
        torch.cuda.is_available() and torch.cuda.device_count() > 1
    )


def _fill_from_config(args: argparse.Namespace, defaults) -> bool:
    """Fill ``args`` from the config ``defaults`` as HF's launch does; True when the precision came from the config.

    No paradigm flag: the config's ``distributed_type`` picks one. A local machine's config fills every setting no
    flag gave (a section's keys, prefixed as flags, where the namespace records which flags were given).
    """
    if not (args.multi_gpu or args.tpu or args.tpu_use_cluster or args.use_deepspeed or args.use_fsdp or args.use_megatron_lm):
        kind = defaults.distributed_type
        args.use_deepspeed = kind == DistributedType.DEEPSPEED
        args.multi_gpu = kind in MULTI_DEVICE_TYPES
        args.tpu = kind == DistributedType.XLA
        args.use_fsdp = kind == DistributedType.FSDP
        args.use_megatron_lm = kind == DistributedType.MEGATRON_LM
        args.tpu_use_cluster = defaults.tpu_use_cluster if args.tpu else False
        args.use_parallelism_config = defaults.parallelism_config != {}
    if args.gpu_ids is None:
        args.gpu_ids = defaults.gpu_ids if defaults.gpu_ids is not None else "all"
    if args.multi_gpu and args.num_machines is None:
        args.num_machines = defaults.num_machines
    if len(args.gpu_ids.split(",")) < 2 and args.gpu_ids != "all" and args.multi_gpu and args.num_machines <= 1:
        raise ValueError(
            "Less than two GPU ids were configured and tried to run on multiple GPUs. "
            "Please ensure at least two are specified for `--gpu_ids`, or use `--gpu_ids='all'`."
        )
    if defaults.compute_environment == ComputeEnvironment.LOCAL_MACHINE:
        for name, value in defaults.__dict__.items():
            if isinstance(value, dict):
                have, prefix = SECTION_FLAG_PREFIXES.get(name, (None, None))
                for key, item in value.items():
                    flag = prefix + key if have and not key.startswith(have) else key
                    if hasattr(args, "nondefault") and flag not in args.nondefault:
                        setattr(args, flag, item)
            elif name not in ("compute_environment", "mixed_precision", "distributed_type") and getattr(args, name, None) is None:
                setattr(args, name, value)
    if not args.debug:
        args.debug = defaults.debug
    from_config = False
    if not args.mixed_precision:
        args.mixed_precision = "no" if defaults.mixed_precision is None else defaults.mixed_precision
        from_config = defaults.mixed_precision is not None
    elif args.mixed_precision == "bf16" and not is_bf16_available(True) and not (args.tpu and is_torch_xla_available(check_is_tpu=True)):
        raise ValueError("bf16 mixed precision requires PyTorch >= 1.10 and a supported device.")
    if args.dynamo_backend is None:
        args.dynamo_backend = "no"
    if args.num_processes == -1:
        raise ValueError("You need to manually pass in `--num_processes` using this config yaml.")
    return from_config


def _fill_without_config(args: argparse.Namespace) -> list[str]:
    """Fill ``args`` with HF's defaults when no config is read (one process per accelerator found); return the
    warning lines naming each default used."""
    warned = []
    if args.num_processes is None:
        args.num_processes = _accelerator_count()
        warned.append(f"\t`--num_processes` was set to a value of `{args.num_processes}`")
    if args.debug is None:
        args.debug = False
    if not args.multi_gpu and args.num_processes > 1 and _several_accelerators():
        warned.append(
            "\t\tMore than one GPU was found, enabling multi-GPU training.\n"
            "\t\tIf this was unintended please pass in `--num_processes=1`."
        )
        args.multi_gpu = True
    if args.num_machines is None:
        warned.append("\t`--num_machines` was set to a value of `1`")
        args.num_machines = 1
    if args.mixed_precision is None:
        warned.append("\t`--mixed_precision` was set to a value of `'no'`")
        args.mixed_precision = "no"
    if not hasattr(args, "use_cpu"):
        args.use_cpu = args.cpu
    if args.dynamo_backend is None:
        warned.append("\t`--dynamo_backend` was set to a value of `'no'`")
        args.dynamo_backend = "no"
    return warned


def _fill_cpu_threads(args: argparse.Namespace, defaults, warned: list[str]) -> None:
    """``--num_cpu_threads_per_process`` off SageMaker: OMP_NUM_THREADS, else 1; CPU ranks without OMP_NUM_THREADS
    share the physical cores (a warning line says so when that gives each more than one)."""
    if defaults is not None and defaults.compute_environment == ComputeEnvironment.AMAZON_SAGEMAKER:
        return
    if args.num_cpu_threads_per_process is not None:
        return
    args.num_cpu_threads_per_process = get_int_from_env(["OMP_NUM_THREADS"], 1)
    if args.use_cpu and args.num_processes >= 1 and get_int_from_env(["OMP_NUM_THREADS"], 0) == 0:
        import psutil

        local_size = get_int_from_env(["MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE"],
                                      max(int(args.num_processes / args.num_machines), 1))
        threads_per_process = int(psutil.cpu_count(logical=False) / local_size)
        if threads_per_process > 1:
            args.num_cpu_threads_per_process = threads_per_process
            warned.append(f"\t`--num_cpu_threads_per_process` was set to `{threads_per_process}` to improve "
                          "out-of-box performance when training on CPUs")


def _validate_launch_command(args: argparse.Namespace):
    """🤗 Accelerate 1.15's launch validation on its launch namespace: ``(args, config or None, precision from config)``.

    Refuses what ``_check_launch_flags`` refuses; then reads the config file (``--config_file``, else the default
    file unless ``--cpu``) and fills what no flag gave from it (``_fill_from_config``), or, with none, fills HF's
    defaults (``_fill_without_config``: as many processes as accelerators, 0 on a CPU-only machine); then the CPU
    thread count. The defaults used without a config are one warning of this module's logger. accelerate-ref's own
    ``launch`` applies the flag checks alone (``validate``): its config rules and ``--cpu`` ranks are its own
    (catalog launch.cli, launch.cpu_ranks).
    """
    _check_launch_flags(args)
    defaults, from_config, warned = None, False, []
    default_file = current_default_config_file()
    if args.config_file is not None or os.path.isfile(default_file) and not args.cpu:
        defaults = load_config_from_file(args.config_file if args.config_file is not None else default_file)
        from_config = _fill_from_config(args, defaults)
    else:
        warned = _fill_without_config(args)
    if args.debug:
        logger.debug("Running script in debug mode, expect distributed operations to be slightly slower.")
    _fill_cpu_threads(args, defaults, warned)
    if warned:
        logger.warning(
            "The following values were not passed to `accelerate launch` and had defaults used instead:\n"
            + "\n".join(warned)
            + "\nTo avoid this warning pass in values for each of the problematic parameters or run `accelerate config`."
        )
    return args, defaults, from_config


def validate(args: argparse.Namespace) -> None:
    """Raise LaunchError for a launch that cannot start (catalog "Launching", bad input); the flag combinations HF
    refuses are its ValueErrors (``_check_launch_flags``); a flag picking a launcher it lacks
    (``UNSUPPORTED_LAUNCHERS``) is refused, not ignored."""
    _check_launch_flags(args)
    for name, (flag, what) in UNSUPPORTED_LAUNCHERS.items():
        if getattr(args, name, None):
            raise LaunchError(f"{flag} asks for {what}, which accelerate-ref launch does not run "
                              "(it starts torchrun processes, or one process)")
    _apply_config(args)
    launcher = getattr(args, "deepspeed_multinode_launcher", None)
    if args.use_deepspeed and args.num_machines > 1 and launcher not in (None, "standard"):
        raise LaunchError(f"--deepspeed_multinode_launcher {launcher} runs the deepspeed runner over {launcher}, which "
                          "accelerate-ref launch does not start; use the standard launcher (torchrun on each machine)")
    if args.num_processes < 1 or args.num_machines < 1:
        raise LaunchError("--num_processes and --num_machines must be at least 1")
    if args.num_processes % args.num_machines:
        raise LaunchError(f"--num_processes {args.num_processes} is not a multiple of --num_machines {args.num_machines}")
    if not 0 <= args.machine_rank < args.num_machines:
        raise LaunchError(f"--machine_rank {args.machine_rank} is out of range for --num_machines {args.num_machines}")
    dry_run_only = [flag for flag, value in (("--device-memory", getattr(args, "device_memory", None)), ("--gpu", getattr(args, "gpu", None)),
                                             ("--summary-json", getattr(args, "summary_json", None)),
                                             ("--report", getattr(args, "report", None)),
                                             ("--memory-snapshot", getattr(args, "memory_snapshot", None)),
                                             ("--no-compute", getattr(args, "no_compute", False)),
                                             ("--steps", getattr(args, "steps", None)),
                                             ("--heaviest-batches", getattr(args, "heaviest_batches", None)),
                                             ("--fit", getattr(args, "fit", None) is not None)) if value]
    if dry_run_only and not args.simulate:
        raise LaunchError(f"{', '.join(dry_run_only)}: only for a dry run (add --simulate cuda, xla or npu)")
    # A dry run puts every simulated machine on this host: no address to give.
    if args.num_machines > 1 and not args.simulate and (args.main_process_ip is None or args.main_process_port is None):
        raise LaunchError("with --num_machines > 1, --main_process_ip and --main_process_port are required")
    if args.module:
        if importlib.util.find_spec(args.training_script.split(".")[0]) is None:
            raise LaunchError(f"module {args.training_script!r} not found")
    elif not args.no_python and not os.path.isfile(args.training_script):
        raise LaunchError(f"script {args.training_script!r} not found")
    host_here = args.machine_rank == 0 and args.main_process_ip in (None, "127.0.0.1", "localhost")
    if args.main_process_port and host_here and is_port_in_use(args.main_process_port):
        raise LaunchError(f"port {args.main_process_port} is already in use (--main_process_port)")


class _Timeout(BaseException):
    """Raised in the launcher's main thread when ``--timeout`` expires (unwinds torchrun's agent, which stops the ranks)."""


@contextmanager
def _deadline(seconds: float | None) -> Iterator[None]:
    if not seconds:
        yield
        return

    def expire(signum, frame):
        raise _Timeout()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def simple_launcher(args: argparse.Namespace) -> None:
    """One process: run the script directly with the launch environment."""
    cmd, env = prepare_simple_launcher_cmd_env(args)
    process = subprocess.Popen(cmd, env=env)
    try:
        with _deadline(args.timeout):
            code = process.wait()
    except _Timeout:
        raise RankFailure(f"the script was still running after --timeout {args.timeout:g}s; stopped it") from None
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    if code != 0:
        raise RankFailure(f"the script exited with code {code}")


def _torchrun_namespace(args: argparse.Namespace) -> argparse.Namespace:
    """torchrun's options with every one ``args`` also holds (``nproc_per_node``, ``nnodes``,
    ``master_port``, ``rdzv_endpoint``, ``standalone``, ``module``, the script and its arguments ...)."""
    from torch.distributed.run import get_args_parser

    torchrun_args = get_args_parser().parse_args([args.training_script])
    for name in vars(torchrun_args):
        if hasattr(args, name):
            setattr(torchrun_args, name, getattr(args, name))
    return torchrun_args


def _run_ranks(args: argparse.Namespace, env: dict[str, str]) -> None:
    """Run torchrun's elastic agent in this process with ``env``; the first failing rank ends the launch."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import run

    torchrun_args = _torchrun_namespace(args)
    timeout = getattr(args, "timeout", None)
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        with _deadline(timeout):
            run(torchrun_args)
    except ChildFailedError as error:
        raise RankFailure(_describe_failure(error)) from None
    except _Timeout:
        raise RankFailure(f"ranks still running after --timeout {timeout:g}s; stopped every rank") from None
    finally:
        os.environ.clear()
        os.environ.update(saved)


def multi_gpu_launcher(args):
    """Ranks through ``torch.distributed.run`` with ``prepare_multi_gpu_env``'s environment (CPU ranks with ``--cpu``)."""
    _run_ranks(args, prepare_multi_gpu_env(args))


def deepspeed_launcher(args):
    """A DeepSpeed launch (🤗 Accelerate's launch options on ``args``; needs the ``deepspeed`` package): torchrun's
    ranks with ``prepare_deepspeed_cmd_env``'s environment, on one machine or each machine of the ``standard``
    multi-node launcher (``validate`` refuses the runner's pdsh, MPI and slurm launchers)."""
    if not is_deepspeed_available():
        raise ImportError("DeepSpeed is not installed: pip install deepspeed")
    _, env = prepare_deepspeed_cmd_env(args)
    _run_ranks(args, env)


def tpu_launcher(args):
    """The script's ``--main_training_function`` on every XLA device through ``torch_xla``'s ``xmp.spawn``.

    The script is imported as a module (its folder put on ``sys.path``; with ``--module`` its name),
    ``sys.argv`` becomes the script and its arguments, and the function runs under ``prepare_tpu``'s
    environment wrapped in ``PrepareForLaunch``. Needs ``torch_xla`` (the simulator's stand-in serves).
    """
    import torch_xla.distributed.xla_multiprocessing as xmp

    if args.no_python:
        raise ValueError("--no_python cannot be used with TPU launcher")
    args, env = prepare_tpu(args, {})
    if args.module:
        module_name = args.training_script
    else:
        script = Path(args.training_script)
        sys.path.append(str(script.parent.resolve()))
        module_name = script.stem
    module = importlib.import_module(module_name)
    if not hasattr(module, args.main_training_function):
        raise ValueError(f"the training script has no function {args.main_training_function!r} (--main_training_function)")
    sys.argv = [module.__file__, *args.training_script_args]
    with patch_environment(**env):
        xmp.spawn(PrepareForLaunch(getattr(module, args.main_training_function)), args=())


def _describe_failure(error) -> str:
    rank, failure = error.get_first_failure()
    how = f"signal {failure.signal_name()}" if failure.exitcode < 0 else f"exit code {failure.exitcode}"
    others = len(error.failures) - 1
    return f"rank {rank} failed with {how}" + (f" ({others} more rank(s) failed)" if others > 0 else "") + "; every rank stopped"


def launch_command(args: argparse.Namespace) -> int:
    """Validate, then run the launch; return the exit status (errors raise LaunchError / RankFailure)."""
    validate(args)
    if args.simulate and getattr(args, "fit", None) is not None:
        from .fit import fit

        if getattr(args, "cli_argv", None) is None:
            raise LaunchError("--fit runs from the command line (accelerate-ref launch ...)")
        return fit(args, args.cli_argv)
    if args.simulate:
        from .dry_run import dry_run

        return dry_run(args)
    if args.use_deepspeed:
        deepspeed_launcher(args)
    elif args.num_processes == 1 and args.num_machines == 1 and not args.use_fsdp:  # FSDP: torchrun's ranks, as in HF
        simple_launcher(args)
    else:
        multi_gpu_launcher(args)
    return 0


def main():
    """``python -m accelerate_ref.commands.launch ...``: the ``launch`` subcommand alone (one-line errors)."""
    from .accelerate_cli import run

    return run(["launch", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
