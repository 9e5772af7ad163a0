"""The options of ``accelerate-ref launch``: 🤗 Accelerate 1.15's launch options, then accelerate-ref's own.

Rule (catalog launch.cli): the parser holds every option of 🤗 Accelerate 1.15's ``launch``
with its group, type, default and choices, so that a command line, a script or a test written
for ``accelerate launch`` parses to the same namespace. Each option takes its ``_`` and its
``-`` spelling (``--num_processes``, ``--num-processes``) when the parser is a
``CustomArgumentParser`` (the ``accelerate-ref`` console script's is). accelerate-ref's own
options (dry runs on the simulator, ``--timeout``, ``-n``) come last, in a group of their own,
so that ``launch -h`` shows 🤗 Accelerate's groups unchanged.

The table holds facts about the options (names, types, defaults); the help texts are ours.
"""

from __future__ import annotations

import argparse
from typing import Any, NamedTuple

from ...utils.constants import TORCH_DYNAMO_MODES
from ...utils.environment import str_to_bool
from ..config.config_utils import DYNAMO_BACKENDS


class Option(NamedTuple):
    """One ``add_argument`` call: the option strings and the keywords."""

    names: tuple[str, ...]
    keywords: dict[str, Any]


def _option(*names: str, **keywords: Any) -> Option:
    return Option(names, keywords)


def _flag(name: str, help: str, **keywords: Any) -> Option:
    """A ``store_true`` option (default False unless ``keywords`` say otherwise)."""
    return _option(name, action="store_true", default=False, help=help, **keywords)


def _override_linear_precision(value: str) -> tuple:
    """``--fp8_override_linear_precision``: three comma-separated booleans."""
    return tuple(map(str_to_bool, value.split(",")))


#: The description ``launch -h`` opens with (it names the hyphen spelling of one option, once).
DESCRIPTION = ("Run a Python script on one or several processes, GPUs or machines. Every option takes "
               "hyphens (`--num-processes=2`) as well as underscores (`--num_processes=2`).")

#: Options of the parser itself (its ``options`` section), before the groups.
TOP_OPTIONS = (
    _option("-h", "--help", action="help", help="Show this help message and exit."),
    _option("--config_file", default=None, help="the config file whose values stand for the flags not given"),
    _option("--quiet", "-q", action="store_true",
            help="show only the relevant tracebacks of a failure (DeepSpeed and single-process launches)"),
    _option("-m", "--module", action="store_true", help="the script is a module name, run as with `python -m`"),
    _option("--no_python", action="store_true", help="run the script as an executable, without `python`"),
    _option("--debug", action="store_true", help="check that every collective gets the same shapes on every process"),
)

_DYNAMO_CHOICES = ["no"] + [backend.lower() for backend in DYNAMO_BACKENDS]

#: ``(title, description, options)`` of each group, in 🤗 Accelerate's order.
GROUPS: tuple[tuple[str, str, tuple[Option, ...]], ...] = (
    ("Hardware Selection Arguments", "Arguments for selecting the hardware to be used.", (
        _flag("--cpu", "train on the CPU, whatever accelerators are present"),
        _flag("--multi_gpu", "one process per GPU"),
        _flag("--tpu", "train on TPU cores"),
    )),
    ("Resource Selection Arguments", "Arguments for fine-tuning how available hardware should be used.", (
        _option("--mixed_precision", type=str, choices=["no", "fp16", "bf16", "fp8"],
                help="train in mixed precision (bf16 needs a device that supports it)"),
        _option("--num_processes", type=int, default=None, help="how many processes to start, across all machines"),
        _option("--num_machines", type=int, default=None, help="how many machines take part"),
        _option("--num_cpu_threads_per_process", type=int, default=None, help="CPU threads for each process"),
        _flag("--enable_cpu_affinity", "bind each process to its CPU cores (NVIDIA machines only)"),
        _option("--dynamo_backend", type=str, choices=_DYNAMO_CHOICES, help="the torch.compile backend"),
        _option("--dynamo_mode", type=str, default="default", choices=TORCH_DYNAMO_MODES, help="the torch.compile mode"),
        _flag("--dynamo_use_fullgraph", "compile the whole model as one graph"),
        _flag("--dynamo_use_dynamic", "trace with dynamic shapes"),
        _flag("--dynamo_use_regional_compilation", "compile repeated blocks once each"),
    )),
    ("Training Paradigm Arguments", "Arguments for selecting which training paradigm to be used.", (
        _flag("--use_deepspeed", "train with DeepSpeed"),
        _flag("--use_fsdp", "train with FSDP"),
        _flag("--use_parallelism_config", "build an N-d ParallelismConfig from the parallelism_config options"),
        _flag("--use_megatron_lm", "train with Megatron-LM"),
    )),
    ("Distributed GPUs", "Arguments related to distributed GPU training.", (
        _option("--gpu_ids", default=None, help="the GPUs of this machine to use, comma-separated"),
        _flag("--same_network", "every machine is on the same local network"),
        _option("--machine_rank", type=int, default=None, help="this machine's index among the machines"),
        _option("--main_process_ip", type=str, default=None, help="the address of machine 0"),
        _option("--main_process_port", type=int, default=None, help="the port machine 0 listens on"),
        _option("-t", "--tee", default="0", type=str, help="copy the processes' output streams to log files"),
        _option("--log_dir", type=str, default=None, help="where torchrun writes its log files"),
        _option("--role", type=str, default="default", help="the role name of the workers"),
        _option("--rdzv_backend", type=str, default="static", help="the rendezvous backend (static, c10d, ...)"),
        _option("--rdzv_conf", type=str, default="", help="more rendezvous settings, as key=value,key=value"),
        _option("--max_restarts", type=int, default=0, help="how often a failed worker group is restarted"),
        _option("--monitor_interval", type=float, default=0.1, help="seconds between checks of the workers"),
    )),
    ("TPU", "Arguments related to TPU.", (
        _option("--tpu_cluster", action="store_true", dest="tpu_use_cluster", help="train on a TPU pod"),
        _option("--no_tpu_cluster", action="store_false", dest="tpu_use_cluster", help="internal: not a TPU pod"),
        _option("--tpu_use_sudo", action="store_true", help="run the script with sudo on each pod worker"),
        _option("--vm", type=str, action="append", help="a Compute VM of the pod (repeatable)"),
        _option("--env", type=str, action="append", help="an environment variable for the pod's VMs (repeatable)"),
        _option("--main_training_function", type=str, default=None, help="the function of the script to run on TPUs"),
        _option("--downcast_bf16", action="store_true", help="with bf16 on TPUs, make doubles bfloat16 too"),
    )),
    ("DeepSpeed Arguments", "Arguments related to DeepSpeed.", (
        _option("--deepspeed_config_file", default=None, type=str, help="a DeepSpeed config file"),
        _option("--zero_stage", default=None, type=int, help="the ZeRO stage (default 2)"),
        _option("--offload_optimizer_device", default=None, type=str, help="where ZeRO keeps optimizer states"),
        _option("--offload_param_device", default=None, type=str, help="where ZeRO keeps parameters"),
        _option("--offload_optimizer_nvme_path", default=None, type=str, help="the NVMe folder for optimizer states"),
        _option("--offload_param_nvme_path", default=None, type=str, help="the NVMe folder for parameters"),
        _option("--gradient_accumulation_steps", default=None, type=int, help="steps to accumulate gradients over"),
        _option("--gradient_clipping", default=None, type=float, help="the gradient norm to clip to"),
        _option("--zero3_init_flag", default=None, type=str, help="build ZeRO-3 models already partitioned"),
        _option("--zero3_save_16bit_model", default=None, type=str, help="save ZeRO-3 models as 16-bit weights"),
        _option("--deepspeed_hostfile", default=None, type=str, help="the hostfile of a multi-node launch"),
        _option("--deepspeed_exclusion_filter", default=None, type=str, help="hosts or GPUs to leave out"),
        _option("--deepspeed_inclusion_filter", default=None, type=str, help="hosts or GPUs to use"),
        _option("--deepspeed_multinode_launcher", default=None, type=str, help="the multi-node launcher (pdsh, ...)"),
        _option("--deepspeed_moe_layer_cls_names", default=None, type=str, help="the MoE layer classes, comma-separated"),
    )),
    ("FSDP Arguments", "Arguments related to Fully Shared Data Parallelism.", (
        _option("--fsdp_version", type=str, default="1", choices=["1", "2"], help="FSDP 1 or FSDP 2"),
        _option("--fsdp_offload_params", default="false", type=str, help="keep parameters and gradients on the CPU"),
        _option("--fsdp_min_num_params", type=int, default=int(1e8), help="the size-based wrap policy's threshold"),
        _option("--fsdp_sharding_strategy", type=str, default="FULL_SHARD", help="FSDP 1's sharding strategy"),
        _option("--fsdp_reshard_after_forward", type=str, default="true", help="FSDP 2: free parameters after forward"),
        _option("--fsdp_auto_wrap_policy", type=str, default=None, help="how submodules are wrapped"),
        _option("--fsdp_transformer_layer_cls_to_wrap", default=None, type=str, help="the layer classes to wrap"),
        _option("--fsdp_backward_prefetch", default=None, type=str, help="FSDP 1's backward prefetch policy"),
        _option("--fsdp_state_dict_type", default=None, type=str, help="how state dicts are gathered"),
        _option("--fsdp_forward_prefetch", default="false", type=str, help="prefetch the next all-gather in forward"),
        _option("--fsdp_use_orig_params", default="true", type=str, help="let optimizers see the original parameters"),
        _option("--fsdp_cpu_ram_efficient_loading", default="true", type=str, help="load weights on the first process only"),
        _option("--fsdp_sync_module_states", default="true", type=str, help="broadcast the first process's weights"),
        _option("--fsdp_activation_checkpointing", default="false", type=str, help="recompute activations in backward"),
        _option("--fsdp_activation_checkpointing_offload", default="false", type=str,
                help="offload checkpointed activations to the CPU"),
    )),
    ("Megatron-LM Arguments", "Arguments related to Megatron-LM.", (
        _option("--megatron_lm_tp_degree", type=int, default=1, help="tensor parallel degree"),
        _option("--megatron_lm_use_custom_fsdp", type=bool, default=False, help="Megatron's own FSDP"),
        _option("--megatron_lm_no_load_optim", type=bool, default=False, help="do not load optimizer states"),
        _option("--megatron_lm_eod_mask_loss", type=bool, default=False, help="mask the loss at end-of-document tokens"),
        _option("--megatron_lm_overlap_cpu_optimizer_d2h_h2d", type=bool, default=False,
                help="overlap the CPU optimizer's copies"),
        _option("--megatron_lm_no_save_optim", type=bool, default=False, help="do not save optimizer states"),
        _option("--megatron_lm_optimizer_cpu_offload", type=bool, default=False, help="run the optimizer on the CPU"),
        _option("--megatron_lm_use_precision_aware_optimizer", type=bool, default=False,
                help="the precision-aware optimizer"),
        _option("--megatron_lm_decoder_last_pipeline_num_layers", type=int, default=None,
                help="decoder layers of the last pipeline stage"),
        _option("--megatron_lm_pp_degree", type=int, default=1, help="pipeline parallel degree"),
        _option("--megatron_lm_num_micro_batches", type=int, default=None, help="micro batches per pipeline step"),
        _option("--megatron_lm_sequence_parallelism", default=None, type=str, help="sequence parallelism"),
        _option("--megatron_lm_recompute_activations", default=None, type=str, help="recompute activations"),
        _option("--megatron_lm_use_distributed_optimizer", default=None, type=str, help="the distributed optimizer"),
        _option("--megatron_lm_gradient_clipping", default=1.0, type=float, help="the gradient norm to clip to"),
        _option("--megatron_lm_recompute_granularity", default=None, type=str, help="full or selective recomputation"),
        _option("--megatron_lm_recompute_method", default=None, type=str, help="uniform or block recomputation"),
        _option("--megatron_lm_recompute_num_layers", default=None, type=int, help="layers to recompute"),
        _option("--megatron_lm_attention_backend", default=None, type=str, help="the attention backend"),
        _option("--megatron_lm_expert_model_parallel_size", default=None, type=int, help="expert parallel degree"),
        _option("--megatron_lm_context_parallel_size", default=None, type=int, help="context parallel degree"),
        _option("--megatron_lm_attention_dropout", default=None, type=float, help="attention dropout"),
        _option("--megatron_lm_hidden_dropout", default=None, type=float, help="hidden dropout"),
        _option("--megatron_lm_attention_softmax_in_fp32", default=None, type=str, help="attention softmax in fp32"),
        _option("--megatron_lm_expert_tensor_parallel_size", default=None, type=int, help="expert tensor parallel degree"),
        _option("--megatron_lm_calculate_per_token_loss", default=None, type=str, help="average the loss per token"),
        _option("--megatron_lm_use_rotary_position_embeddings", default=None, type=str, help="rotary position embeddings"),
    )),
    ("FP8 Arguments", "Arguments related to FP8 training (requires `--mixed_precision=fp8`)", (
        _option("--fp8_backend", type=str, choices=["ao", "te", "msamp"], help="the FP8 library"),
        _flag("--fp8_use_autocast_during_eval", "keep FP8 autocast in evaluation (TransformerEngine)"),
        _option("--fp8_margin", type=int, default=0, help="the scaling factor's margin (TransformerEngine)"),
        _option("--fp8_interval", type=int, default=1, help="steps between scaling factor updates (TransformerEngine)"),
        _option("--fp8_format", type=str, default="HYBRID", choices=["HYBRID", "E4M3", "E5M2"], help="the FP8 format"),
        _option("--fp8_amax_history_len", type=int, default=1024, help="the amax history length (TransformerEngine)"),
        _option("--fp8_amax_compute_algo", type=str, default="most_recent", choices=["max", "most_recent"],
                help="how amax is taken from its history (TransformerEngine)"),
        _option("--fp8_override_linear_precision", type=_override_linear_precision, default=(False, False, False),
                help="higher precision for the forward, input-gradient and weight-gradient matmuls, e.g. false,false,true"),
        _option("--fp8_opt_level", type=str, default="O2", choices=["O1", "O2"], help="the MS-AMP optimisation level"),
        _option("--fp8_enable_fsdp_float8_all_gather", default="true", type=str_to_bool,
                help="all-gather FSDP parameters in float8 (torchao)"),
        _option("--fp8_pad_inner_dim", default="true", type=str_to_bool, help="pad inner dimensions for float8 (torchao)"),
    )),
    ("AWS Arguments", "Arguments related to AWS.", (
        _option("--aws_access_key_id", type=str, default=None, help="the AWS access key id of a SageMaker launch"),
        _option("--aws_secret_access_key", type=str, default=None, help="the AWS secret key of a SageMaker launch"),
    )),
    ("MPI Arguments", "Arguments related to mpirun for Multi-CPU", (
        _option("--mpirun_hostfile", type=str, default=None, help="the hostfile mpirun starts CPU processes from"),
    )),
    ("ParallelismConfig Arguments", "Arguments related to the ParallelismConfig used for distributed training.", (
        _option("--parallelism_config_dp_replicate_size", type=int, default=1, help="data parallel replicas"),
        _option("--parallelism_config_dp_shard_size", type=int, default=1, help="data parallel shards"),
        _option("--parallelism_config_tp_size", type=int, default=1, help="tensor parallel degree"),
        _option("--parallelism_config_cp_size", type=int, default=1, help="context parallel degree"),
        _option("--parallelism_config_cp_backend", type=str, choices=["torch"], default="torch",
                help="the context parallel backend"),
        _option("--parallelism_config_cp_comm_strategy", type=str, default="allgather",
                help="the context parallel exchange (allgather or alltoall)"),
        _option("--parallelism_config_sp_size", type=int, default=1, help="sequence parallel degree"),
        _option("--parallelism_config_sp_backend", type=str, choices=["deepspeed"], default="deepspeed",
                help="the sequence parallel backend"),
        _option("--parallelism_config_sp_seq_length", type=str, default=None, help="the sequence length"),
        _option("--parallelism_config_sp_seq_length_is_variable", type=bool, default=True,
                help="whether sequence lengths vary"),
        _option("--parallelism_config_sp_attn_implementation", type=str, default="sdpa",
                help="the attention implementation"),
    )),
)

#: The positional arguments, after every option.
POSITIONALS = (
    _option("training_script", type=str, help="the script to run (a module name with --module)"),
    _option("training_script_args", nargs=argparse.REMAINDER, help="the script's own arguments"),
)

#: accelerate-ref's own options: its group's title, description and options.
#: ``--fit N`` (launch and ``estimate-memory --training``; :mod:`accelerate_ref.commands.fit`).
FIT_HELP = ("with --simulate cuda and a budget: when the run does not fit, try FSDP2, activation checkpointing, more "
            "processes up to N (the processes given: none more), CPU offload, then DeepSpeed ZeRO-3 (each a dry run "
            "without compute), and print the options that fit")
OWN_GROUP = ("accelerate-ref Arguments", "accelerate-ref's own options: a shorter flag, a deadline and dry runs.", (
    _option("-n", dest="num_processes", type=int, default=None, help="as --num_processes"),
    _option("--timeout", type=float, default=None, help="stop every process after this many seconds"),
    _option("--simulate", choices=["cpu", "cuda", "xla", "npu"], default=None,
            help="dry run on simulated processes with that device family's mock, then a run summary"),
    _option("--device_memory", default=None,
            help="with --simulate cuda|xla|npu: each device's memory budget (bytes, or 40GiB, 16GB)"),
    _option("--gpu", default=None, help="with --simulate: the budget of a GPU by name (a100-40gb, h100-80gb, ...)"),
    _option("--summary_json", default=None, help="with --simulate: also write the run summary as JSON here"),
    _option("--report", default=None, metavar="PATH.html",
            help="with --simulate: also write the run as one HTML page that opens offline: each process's allocated and "
                 "reserved memory over the run (optimizer steps marked, the peak and its script line), what it held at "
                 "its peak, the findings and the verdict (needs plotly: pip install 'accelerate-ref[report]')"),
    _option("--memory_snapshot", default=None, metavar="DIR",
            help="with --simulate cuda: also write each process's allocation history as DIR/rank<N>.pickle, the file "
                 "torch.cuda.memory._dump_snapshot writes on a GPU: open it with `python -m torch.cuda._memory_viz "
                 "trace_plot DIR/rank0.pickle -o trace.html` or at pytorch.org/memory_viz"),
    _option("--no_compute", action="store_true", default=False,
            help="with --simulate cuda|xla|npu: tensors carry no values (shapes, dtypes, memory, collectives)"),
    _option("--steps", type=int, default=None, help="with --simulate cuda|xla|npu: end each process after N optimizer steps"),
    _option("--heaviest_batches", type=int, default=None, metavar="K",
            help="with --simulate cuda|xla|npu: read each data loader's epoch first (collation only) and run its K "
                 "largest batches first"),
    _option("--fit", type=int, default=None, metavar="N", help=FIT_HELP),
))


def _add(container: Any, options: tuple[Option, ...]) -> None:
    for option in options:
        container.add_argument(*option.names, **option.keywords)


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    """Add 🤗 Accelerate's launch options (``TOP_OPTIONS``, ``GROUPS``), accelerate-ref's (``OWN_GROUP``) and the
    positionals to ``parser`` (made with ``add_help=False``: ``-h`` is one of the options)."""
    _add(parser, TOP_OPTIONS)
    for title, description, options in GROUPS:
        _add(parser.add_argument_group(title, description), options)
    title, description, options = OWN_GROUP
    _add(parser.add_argument_group(title, description), options)
    _add(parser, POSITIONALS)
