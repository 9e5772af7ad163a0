"""The ND-parallel setup matrix of issue 34 (item 2): HF accelerate's ``ParallelismConfig`` layouts, each dry-run on
mock GPUs with a Transformers Llama loaded from a local folder (``from_pretrained(tp_plan="auto", device_mesh=...)``
as HF's ``examples/torch_native_parallelism/nd_parallel.py`` loads it), AdamW, two steps under bf16 autocast, until
every rank trains with the model states the arithmetic gives.

The arithmetic (fp32 parameters, their gradients and AdamW's two moments): a parameter the config's tensor-parallel
plan names (``base_model_tp_plan``: the attention and MLP projections) is split over the ``tp`` ranks (``colwise``
along dim 0, ``rowwise`` along dim 1), and FSDP2 keeps ceil(dim 0 / shards) rows of every parameter's local part over
``dp_shard x cp`` ranks (the ``dp_shard_cp`` mesh); ``dp_replicate`` copies.
The model's own plan for ``lm_head`` (``colwise_rep``) is not applied by ``from_pretrained(tp_plan="auto")``
(Transformers 4.57), so ``lm_head`` is replicated over ``tp``, as on a GPU.

accelerate_ref runs the data-parallel dimensions only (it refuses ``tp``/``cp``/``sp`` by name): these rows run HF
accelerate. ``make test`` runs a row of each parallelism it adds to data parallelism (dp_shard x tp, dp_shard x cp),
``make extended`` the rest (HSDP x tp over 2 machines, 16 and 64 ranks without compute, a Llama-3-70B-shaped
checkpoint of holes at 16 and 64); a row the mock could not run would be a strict xfail naming why (:data:`LIMITS`). The tp rows need Transformers 4 (:data:`REPLICATE_PARALLEL`).

Then HF's own two scripts of ``examples/torch_native_parallelism``, unmodified, at 8 GPUs with offline stand-ins
(``make extended``, given a checkout: :data:`EXAMPLES`), the misconfigurations the dry run names in one line (item
3), and a tp group's diverging collective (item 4).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import importlib
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from simulators.fork_root import run_module
from accelerate_ref.commands.accelerate_cli import run

from .nd_scripts import LLAMA, LLAMA_70B, QWEN, SAVE_LLAMA, SCRIPT, SP_SCRIPT, SPARSE_LLAMA, WORDS


@dataclasses.dataclass(frozen=True)
class Layout:
    """One row: the sizes (dp_replicate, dp_shard, tp, cp, sp) and the machines the ranks run on.

    A row with ``sp`` > 1 runs DeepSpeed's sequence parallelism (:data:`SP_SCRIPT`, ZeRO-3) with ``dp_shard`` as its
    data-parallel degree; the others run :data:`SCRIPT` (FSDP2 over ``dp_shard_cp``)."""

    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    cp: int = 1
    sp: int = 1
    machines: int = 1
    #: ``--no-compute``: meta payloads, the same books.
    no_compute: bool = False
    #: The model, a key of :data:`MODELS`.
    model: str = "small"
    steps: int = 2

    @property
    def ranks(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp * self.cp * self.sp

    @property
    def timeout(self) -> int:
        """The dry run's ``--timeout``: its ranks' wait for each other (the 70B at 64 ranks: about 10 minutes, and
        a busier machine's twice that)."""
        return 1800 if self.model == "70b" else 900

    @property
    def fsdp(self) -> int:
        """The ranks FSDP2 shards over (``dp_shard_cp``), or ZeRO-3 under sequence parallelism: every rank (DeepSpeed
        partitions over its sequence-data-parallel group, dp x sp)."""
        return self.dp_shard * self.cp * self.sp

    @property
    def distributed_type(self) -> str:
        return "DEEPSPEED" if self.sp > 1 else "FSDP"

    def model_states(self, parameters: dict[str, tuple[int, ...]], tp_plan: dict[str, str], value_bytes: int = 4,
                     optimizer_values: int = 2) -> dict[str, int]:
        """Bytes per rank: each parameter's local part after tensor parallelism (``colwise``: dim 0 over the tp
        ranks, ``rowwise``: dim 1), of which FSDP2 keeps ceil(dim 0 / shards) rows (the last shard padded) and ZeRO-3
        ceil(elements / shards) of the flattened parameter; the parameters and gradients ``value_bytes`` a value,
        ``optimizer_values`` fp32 states a value (AdamW's two). Under ZeRO-3 (the sequence-parallel rows, bf16) a
        rank holds its partition twice: DeepSpeed's bf16 partition (``ds_tensor``) and the optimizer's fp32 copy
        of it (stage3.py: ``fp32_partitioned_groups_flat``), and so for the gradients: the bf16 partitions'
        buffer and the fp32 flat copy the step gives the master weights (``_prepare_fp32_grad_for_sub_group``)."""
        elements = 0
        for name, shape in parameters.items():
            local = list(shape)
            style = next((style for pattern, style in tp_plan.items() if fnmatch.fnmatch(name, f"model.{pattern}.*")), None)
            if style is not None:
                local[0 if style == "colwise" else 1] //= self.tp
            if self.sp > 1:
                elements += -(-math.prod(local) // self.fsdp)
            else:
                elements += -(-local[0] // self.fsdp) * math.prod(local[1:])
        if self.sp > 1:
            value_bytes = 2 + 4
        return {"trainable_parameters": value_bytes * elements, "frozen_parameters": 0, "quantized_weights": 0,
                "gradients": value_bytes * elements,
                "optimizer_state": 4 * optimizer_values * elements}


LAYOUTS = {
    "dp_shard2-tp2": Layout(dp_shard=2, tp=2),
    "hsdp2x2-tp2-2-machines": Layout(dp_replicate=2, dp_shard=2, tp=2, machines=2),
    "dp_shard4-tp2-no-compute": Layout(dp_shard=4, tp=2, no_compute=True),
    "hsdp2x4-tp2-16-ranks-2-machines-no-compute": Layout(dp_replicate=2, dp_shard=4, tp=2, machines=2, no_compute=True),
    "dp_shard8-tp8-64-ranks-8-machines-no-compute": Layout(dp_shard=8, tp=8, machines=8, no_compute=True),
    "llama70b-dp_shard2-tp8-16-ranks-2-machines-no-compute": Layout(dp_shard=2, tp=8, machines=2, no_compute=True,
                                                                    model="70b", steps=1),
    "llama70b-dp_shard8-tp8-64-ranks-8-machines-no-compute": Layout(dp_shard=8, tp=8, machines=8, no_compute=True,
                                                                    model="70b", steps=1),
    "cp2-fsdp2": Layout(cp=2),
    "dp_shard2-cp2": Layout(dp_shard=2, cp=2),
    "tp2-cp2": Layout(tp=2, cp=2),
    "qwen2-dp_shard2-tp2": Layout(dp_shard=2, tp=2, model="qwen"),
    "sp4-deepspeed": Layout(sp=4),
    "dp_shard2-sp2-deepspeed": Layout(dp_shard=2, sp=2),
    "dp_shard2-sp4-deepspeed-2-machines": Layout(dp_shard=2, sp=4, machines=2),
    "dp_shard2-sp8-deepspeed-16-ranks-2-machines-no-compute": Layout(dp_shard=2, sp=8, machines=2, no_compute=True),
    "dp_shard8-sp8-deepspeed-64-ranks-8-machines-no-compute": Layout(dp_shard=8, sp=8, machines=8, no_compute=True),
}
#: Rows the mock cannot run yet, and why (strict xfails under ``make extended``).
LIMITS: dict[str, str] = {}  # none now: DeepSpeed's Ulysses adapter reads the lengths it exchanges (kept values)
#: HF accelerate 1.15 prepares FSDP2 + tp with Transformers' ``ReplicateParallel``, which Transformers 5 removed (and
#: Transformers 5's ``from_pretrained(tp_size=...)`` builds its own mesh over the whole world): with it installed, the
#: layouts cannot train on a GPU either, and the dry run must say so. The tp rows then run with the Transformers 4
#: that ``make`` installs beside the venv's (:data:`TRANSFORMERS4`, first on the ranks' import path).
REPLICATE_PARALLEL = hasattr(importlib.import_module("transformers.integrations.tensor_parallel"), "ReplicateParallel")
#: ``make``'s ``--target`` install of Transformers 4.57 with the huggingface_hub and tokenizers it requires.
TRANSFORMERS4 = Path(sys.prefix) / "transformers4"
WITHOUT_REPLICATE_PARALLEL = ("the installed Transformers has no integrations.tensor_parallel.ReplicateParallel, which "
                              f"HF accelerate 1.15's FSDP2 + tp imports (Transformers 5 removed it), and {TRANSFORMERS4} "
                              "(make's Transformers 4) is missing")
#: The rows ``make test`` runs.
#: The layouts make test runs (the sequence-parallel ones, DeepSpeed's, under make extended: make test dry-runs
#: DeepSpeed's ZeRO-3 in its setups, launch and Trainer tests).
SMOKE = {"dp_shard2-tp2", "dp_shard2-cp2"}
#: Sequence-parallel rows need DeepSpeed (the ``deepspeed`` extra, which ``make`` installs): skipped without it.
DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
WITHOUT_DEEPSPEED = ("deepspeed is not installed (the deepspeed extra: pip install --no-deps deepspeed hjson msgpack "
                     "ninja py-cpuinfo einops), and HF 1.15's sequence parallelism is DeepSpeed's ALST/Ulysses")


def tensor_parallel_env() -> dict[str, str] | None:
    """The environment in which HF accelerate 1.15's FSDP2 + tp can run: this one, if its Transformers has
    ``ReplicateParallel``, else with :data:`TRANSFORMERS4` first on the import path; None without either."""
    if REPLICATE_PARALLEL:
        return dict(os.environ)
    if TRANSFORMERS4.is_dir():
        return {**os.environ, "PYTHONPATH": os.pathsep.join([str(TRANSFORMERS4), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return None


#: ``Layout.model`` -> how it is saved (:data:`SAVE_LLAMA`: random weights and a tokenizer; :data:`SPARSE_LLAMA`: a
#: checkpoint of holes), its Transformers architecture and its shape.
MODELS = {"small": (SAVE_LLAMA, "Llama", LLAMA), "qwen": (SAVE_LLAMA, "Qwen2", QWEN),
          "70b": (SPARSE_LLAMA, "Llama", LLAMA_70B)}


def save_llama(folder: Path, env: dict[str, str], model: str = "small") -> tuple[Path, dict[str, tuple[int, ...]],
                                                                                dict[str, str]]:
    """The :data:`MODELS` entry ``model`` saved to ``folder`` by the Transformers of ``env`` (with a tokenizer of
    :data:`WORDS` unless a checkpoint of holes), with its parameters' shapes and tensor-parallel plan."""
    script, architecture, shape = MODELS[model]
    made = subprocess.run([sys.executable, "-c", script, str(folder), architecture, json.dumps(shape), WORDS], env=env,
                          text=True, capture_output=True, timeout=120)
    assert made.returncode == 0, made.stderr[-3000:]
    saved = json.loads(made.stdout.splitlines()[-1])
    return folder, {name: tuple(shape) for name, shape in saved["sizes"].items()}, saved["tp_plan"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """:func:`save_llama` by the venv's Transformers."""
    return save_llama(tmp_path_factory.mktemp("llama"), dict(os.environ))


@pytest.fixture(scope="module")
def llama_for_tensor_parallel(saved_for_tensor_parallel):
    """:func:`save_llama`'s small Llama by the Transformers the tp rows run with (:func:`tensor_parallel_env`), and
    that environment."""
    return saved_for_tensor_parallel("small")


@pytest.fixture(scope="module")
def saved_for_tensor_parallel(tmp_path_factory):
    """A function of a :data:`MODELS` key: that model saved once by the Transformers the tp rows run with, its
    shapes, plan, and that environment."""
    saved = {}

    def save(model: str) -> tuple:
        if model not in saved:
            env = _tensor_parallel_env_or_skip()
            saved[model] = (*save_llama(tmp_path_factory.mktemp(f"{model}_tp"), env, model), env)
        return saved[model]

    return save


def _tensor_parallel_env_or_skip() -> dict[str, str]:
    env = tensor_parallel_env()
    if env is None:
        pytest.skip(WITHOUT_REPLICATE_PARALLEL)
    return env


def _cases():
    for name in LAYOUTS:
        marks = [pytest.mark.xfail(strict=True, reason=LIMITS[name])] if name in LIMITS else []
        if name not in SMOKE:
            marks.append(pytest.mark.extended)
        if LAYOUTS[name].sp > 1 and not DEEPSPEED:
            marks.append(pytest.mark.skip(reason=WITHOUT_DEEPSPEED))
        if LAYOUTS[name].model == "70b":  # past the launch's own timeout and the subprocess's (README, "N-D parallelism")
            marks.append(pytest.mark.timeout(LAYOUTS[name].timeout + 600))
        yield pytest.param(name, marks=marks, id=name)


def dry_run(tmp_path, folder, layout: Layout, env: dict[str, str]) -> tuple[int, str, dict]:
    """``accelerate-ref launch --simulate cuda`` of :data:`SCRIPT` (:data:`SP_SCRIPT` for an sp row, 128 tokens) in
    a process of its own, with ``env``."""
    if layout.sp > 1:
        (tmp_path / "nd.py").write_text(SP_SCRIPT)
        arguments = [str(size) for size in (layout.dp_shard, layout.sp, 128, layout.steps)]
    else:
        (tmp_path / "nd.py").write_text(SCRIPT)
        sizes = [str(size) for size in (layout.dp_replicate, layout.dp_shard, layout.tp, layout.cp, layout.steps)]
        arguments = [*sizes, f"{MODELS[layout.model][1]}DecoderLayer"]
    argv = ["launch", "--simulate", "cuda", *(["--no-compute"] if layout.no_compute else []), "--num_processes",
            str(layout.ranks), "--num_machines", str(layout.machines), "--timeout", str(layout.timeout), "--summary-json",
            "summary.json", "nd.py", str(folder), *arguments]
    done = run_module("accelerate_ref.commands.accelerate_cli", *argv, timeout=layout.timeout + 300, cwd=tmp_path,
                      env={**env, "HF_HOME": str(tmp_path / "hf_home")})
    summary = json.loads((tmp_path / "summary.json").read_text()) if (tmp_path / "summary.json").exists() else {}
    return done.returncode, done.stdout + done.stderr, summary


@pytest.mark.parametrize("name", list(_cases()))
def test_nd_layout_dry_runs_with_each_ranks_model_states_as_the_arithmetic(tmp_path, request, name):
    layout = LAYOUTS[name]
    if layout.tp > 1:
        folder, sizes, tp_plan, env = request.getfixturevalue("saved_for_tensor_parallel")(layout.model)
    else:
        folder, sizes, tp_plan, env = (*request.getfixturevalue("llama"), dict(os.environ))
    status, output, summary = dry_run(tmp_path, folder, layout, env)
    assert status == 0, f"{name}:\n{output[-4000:]}"
    for rank in range(layout.ranks):
        assert f"[rank {rank}] trained DistributedType.{layout.distributed_type}" in output, output[-3000:]
    expected = layout.model_states(sizes, tp_plan)
    for rank in summary["ranks"]:
        for device, books in rank["memory"].items():
            assert books["model_states"] == expected, (
                f"{name}, rank {rank['rank']} on {device}: model states after a step {books['model_states']}, the "
                f"arithmetic says {expected} (tp {layout.tp}, {'ZeRO-3' if layout.sp > 1 else 'FSDP2'} over "
                f"{layout.fsdp}, AdamW)")


@pytest.mark.skipif(REPLICATE_PARALLEL, reason="the installed Transformers has ReplicateParallel: the layouts train")
def test_with_transformers_5_tensor_parallel_over_fsdp2_is_refused_as_on_a_gpu(tmp_path, llama):
    """Transformers 5's ``from_pretrained(tp_size=2)`` builds a tp-only mesh and refuses a world larger than it (pure
    Python, before any device work): the dry run names it and exits 1, where a rented node would fail the same way."""
    folder, _, _ = llama
    status, output, _ = dry_run(tmp_path, folder, LAYOUTS["dp_shard2-tp2"], dict(os.environ))
    assert status == 1, output[-3000:]
    assert "The parallel mesh requires 2 processes, but world_size is 4" in output, output[-3000:]


def test_tensor_parallel_alone_is_named_as_dtensors_refusal_of_the_optimizers_mixed_parameters(tmp_path, llama):
    """tp without FSDP: HF 1.15 makes DTensors of the planned parameters only (it replicates the others as DTensors
    under FSDP2 alone), so AdamW's foreach step mixes DTensors and plain tensors, which DTensor refuses, on a GPU as on
    the mock: the dry run names it and exits 1 (under Transformers 4 and 5)."""
    folder, _, _ = llama
    status, output, _ = dry_run(tmp_path, folder, Layout(tp=2), dict(os.environ))
    assert status == 1, output[-3000:]
    assert "got mixed torch.Tensor and DTensor" in output, output[-3000:]


# -- misconfigurations (item 3): one line naming the rule, the sizes and the script's line, exit 1 ------------------

MISCONFIGURED = textwrap.dedent("""\
    import sys

    from accelerate import Accelerator
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import FullyShardedDataParallelPlugin

    sizes = dict(zip(("dp_shard_size", "tp_size", "cp_size", "sp_size"), map(int, sys.argv[1:5])))
    config = ParallelismConfig(**sizes)
    accelerator = Accelerator(parallelism_config=config, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
    group = accelerator.torch_device_mesh[sys.argv[5]]
    print("built", flush=True)
    """)


@pytest.mark.parametrize("ranks, argv, line, error", [
    (4, ["2", "1", "1", "1", "dp_shard"], 9,
     "ValueError: ParallelismConfig total_size (2) does not match num_processes (4). Please adjust "
     "dp_replicate_size/ dp_shard_size/tp_size/cp_size/sp_size."),
    (4, ["1", "1", "2", "2", "dp_shard"], 8, "ValueError: "),
    (2, ["2", "1", "1", "1", "tp"], 10, "KeyError: "),
], ids=["world-not-the-layouts-size", "layout-hf-refuses", "mesh-dimension-the-layout-lacks"])
def test_a_misconfigured_layout_is_one_line_naming_hfs_error_and_the_scripts_line(tmp_path, monkeypatch, capsys,
                                                                                  ranks, argv, line, error):
    assert_one_finding(tmp_path, monkeypatch, capsys, MISCONFIGURED, ranks, argv, line, error)


def _line_of(script: str, text: str) -> int:
    return next(number for number, line in enumerate(script.splitlines(), 1) if text in line)


@pytest.mark.skipif(not DEEPSPEED, reason=WITHOUT_DEEPSPEED)
@pytest.mark.parametrize("argv, line, error", [
    (["1", "2", "128", "1"], "accelerator.prepare",
     "AssertionError: Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * "
     "gradient_acc_step * world_size 1 != 1 * 1 * 2.0"),
    pytest.param(["2", "2", "127", "1"], "enumerate(loader)", "ValueError: batch's seqlen=127 isn't divisible by sp-size=2",
                 marks=pytest.mark.extended),  # make test runs the first; both run under make extended
], ids=["sp-data-parallel-degree-unset", "sequence-the-sp-degree-does-not-divide"])
def test_a_misconfigured_sequence_parallel_run_is_one_line_naming_deepspeeds_error(tmp_path, monkeypatch, capsys,
                                                                                   llama, argv, line, error):
    """DeepSpeed's sequence parallelism at 4 ranks: sp 2 with ``dp_shard_size`` left at 1 (HF 1.15 sizes DeepSpeed's
    batch by ``data_parallel_size``, DeepSpeed by the ranks outside the sp groups: its batch assertion at
    ``prepare``), and 127 tokens over sp 2 (the Ulysses data loader's refusal at the first batch)."""
    folder, _, _ = llama
    assert_one_finding(tmp_path, monkeypatch, capsys, SP_SCRIPT, 4, [str(folder), *argv], _line_of(SP_SCRIPT, line),
                       error)


HEADS = textwrap.dedent("""\
    import sys

    from accelerate import Accelerator
    from accelerate.parallelism_config import ParallelismConfig
    from transformers import AutoModelForCausalLM

    accelerator = Accelerator(parallelism_config=ParallelismConfig(tp_size=3))
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], tp_plan="auto", tp_size=3,
                                                 device_mesh=accelerator.torch_device_mesh)
    """)


def test_a_tp_degree_that_does_not_divide_the_heads_is_named_where_the_model_loads(tmp_path, monkeypatch, capsys,
                                                                                    llama):
    """tp 3 over a Llama of 8 heads (and 8 key-value heads): named at ``from_pretrained``, where on a GPU the first
    forward's reshape would fail (under Transformers 4 and 5)."""
    folder, _, _ = llama
    assert_one_finding(tmp_path, monkeypatch, capsys, HEADS, 3, [str(folder)], 8,
                       "ValueError: tensor parallelism over 3 ranks gives each rank whole attention heads only when 3 "
                       "divides the model's heads, but it has 8 attention heads and 8 key-value heads, which 3 does "
                       "not divide")


SEQUENCE_SPLIT = textwrap.dedent("""\
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    dist.init_process_group("nccl")
    torch.cuda.set_device(dist.get_rank())
    mesh = init_device_mesh("cuda", (2,), mesh_dim_names=("cp",))
    tokens = torch.ones(1, 127, device="cuda")
    with context_parallel(mesh, buffers=[tokens], buffer_seq_dims=[1]):
        pass
    """)


def test_a_sequence_the_cp_degree_does_not_split_evenly_is_named_with_the_sizes(tmp_path, monkeypatch, capsys):
    """127 tokens over cp 2 (torch's default: no load balancing, one part per rank). On GPUs the ranks' shards differ
    in size and the ring's exchanges do not match (gloo aborts the rank)."""
    assert_one_finding(tmp_path, monkeypatch, capsys, SEQUENCE_SPLIT, 2, [], 10,
                       "ValueError: context parallelism over 2 ranks splits each buffer's sequence into 2 equal parts, "
                       "but buffer 0 has 127 along dimension 1, which 2 does not divide")


def assert_one_finding(tmp_path, monkeypatch, capsys, script: str, ranks: int, argv: list[str], line: int,
                       error: str) -> None:
    """The dry run of ``script`` exits 1 with one finding: the ranks that raised, ``train.py:line`` and ``error``."""
    (tmp_path / "train.py").write_text(script)
    monkeypatch.chdir(tmp_path)
    status = run(["launch", "--simulate", "cuda", "--num_processes", str(ranks), "--timeout", "120", "train.py", *argv])
    output = capsys.readouterr().out
    summary = output[output.index("== dry run summary"):]
    findings = [text for text in summary.splitlines() if " raised at " in text]
    assert status == 1 and len(findings) == 1, summary
    who, _, finding = findings[0].partition(" raised at ")
    assert who == "every rank" or who.startswith("rank(s) "), summary  # the first to raise stops the others
    assert finding.startswith(f"train.py:{line}: {error}"), summary


# -- collective agreement across the mesh (item 4) -------------------------------------------------------------------

DIVERGING = textwrap.dedent("""\
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("nccl")
    torch.cuda.set_device(dist.get_rank())
    mesh = init_device_mesh("cuda", (2, 2), mesh_dim_names=("dp", "tp"))
    t = torch.ones(4, device="cuda")
    dist.all_reduce(t, group=mesh["dp"].get_group())
    if dist.get_rank() == 3:
        dist.broadcast(t, group_src=0, group=mesh["tp"].get_group())
    else:
        dist.all_reduce(t, group=mesh["tp"].get_group())
    dist.barrier()
    """)


def test_a_rank_whose_tp_group_issues_another_collective_is_named_with_op_group_and_line(tmp_path, monkeypatch, capsys):
    """Ranks 2 and 3 form a tp group; rank 3 broadcasts where rank 2 all-reduces: the watch names both, each with its
    op, its mesh group (torch names a mesh dimension's group ``mesh_<dim>``) and its line, well before the timeout."""
    (tmp_path / "train.py").write_text(DIVERGING)
    monkeypatch.chdir(tmp_path)
    status = run(["launch", "--simulate", "cuda", "--num_processes", "4", "--timeout", "120", "train.py"])
    summary = capsys.readouterr().out.split("== dry run summary")[-1]
    assert status == 1 and "mismatch ==" in summary.splitlines()[0], summary
    lines = {rank: next(text for text in summary.splitlines() if text.startswith(f"rank {rank}: collective mismatch"))
             for rank in (2, 3)}
    assert "at train.py:13: in #1 gloo:all_reduce shapes [4] dtypes [Float] in group mesh_tp" in lines[2], summary
    assert "at train.py:11: in #1 gloo:broadcast shapes [4] dtypes [Float] in group mesh_tp" in lines[3], summary


# -- HF's own examples: examples/torch_native_parallelism's two scripts, unmodified, at 8 GPUs -----------------------

#: A checkout's ``examples`` folder: HF ships its examples in no package, and the tests reach no network.
EXAMPLES = Path(os.environ.get("ACCELERATE_EXAMPLES", "")) / "torch_native_parallelism"
WITHOUT_EXAMPLES = ("HF's examples are in no package: set ACCELERATE_EXAMPLES to the examples/ folder of a checkout of "
                    "github.com/huggingface/accelerate")
#: Each run's options after the script's own: a short sequence, two steps, the stand-in Llama, outputs in the run's
#: folder (``nd_parallel_trainer.py`` trains one epoch of the stand-in data set).
ND_PARALLEL_OPTIONS = ("--sequence-length", "128", "--num-steps", "2")


@dataclasses.dataclass(frozen=True)
class ExampleRun:
    """One of HF's scripts at a layout: its options (the sizes, or the script reads them from HF's config file)."""

    script: str
    layout: Layout
    config: str | None = None
    #: Launch options after the config file's (overriding its sizes).
    launch: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    #: The optimizer's fp32 states a value: ``nd_parallel.py`` steps SGD (none), the Trainer AdamW (two).
    optimizer_values: int = 0
    #: Whether the optimizer keeps a step counter a parameter on the GPU (4 bytes each): the Trainer's default,
    #: AdamW with ``fused=True`` (``adamw_torch_fused``), does; plain AdamW keeps them on the host.
    step_counters: bool = False

    @property
    def value_bytes(self) -> int:
        """``nd_parallel_trainer.py`` loads fp32. ``nd_parallel.py`` loads bf16, and HF 1.15 upcasts every trainable
        parameter to fp32 under FSDP2 with mixed precision (``param.data = param.data.to(torch.float32)``), which
        on a DTensor parameter (tensor parallelism's) changes the wrapper's dtype and not its local shard (torch's
        ``set_data``; so on the CPU with gloo too): with tp the shards stay bf16."""
        return 2 if self.script == "nd_parallel.py" and self.layout.tp > 1 else 4


EXAMPLE_RUNS = {
    "nd_parallel-dp_shard4-tp2": ExampleRun("nd_parallel.py", Layout(dp_shard=4, tp=2),
                                            options=("--dp-shard-size", "4", "--tp-size", "2", *ND_PARALLEL_OPTIONS)),
    "nd_parallel-hsdp2x2-tp2": ExampleRun("nd_parallel.py", Layout(dp_replicate=2, dp_shard=2, tp=2), options=(
        "--dp-replicate-size", "2", "--dp-shard-size", "2", "--tp-size", "2", *ND_PARALLEL_OPTIONS)),
    "nd_parallel-dp_shard2-cp4": ExampleRun("nd_parallel.py", Layout(dp_shard=2, cp=4),
                                            options=("--dp-shard-size", "2", "--cp-size", "4", *ND_PARALLEL_OPTIONS)),
    "nd_parallel_trainer-tp_hsdp": ExampleRun("nd_parallel_trainer.py", Layout(dp_replicate=2, dp_shard=2, tp=2),
                                              config="configs/tp_hsdp.yaml",
                                              options=("--sequence-length", "128"), optimizer_values=2,
                                              step_counters=True),
    "nd_parallel_trainer-dp_shard4-tp2": ExampleRun(
        "nd_parallel_trainer.py", Layout(dp_shard=4, tp=2), config="configs/tp_hsdp.yaml",
        launch=("--parallelism_config_dp_replicate_size", "1", "--parallelism_config_dp_shard_size", "4"),
        options=("--sequence-length", "128"), optimizer_values=2, step_counters=True),
    "nd_parallel_trainer-cp8": ExampleRun("nd_parallel_trainer.py", Layout(cp=8), config="configs/cp.yaml",
                                          options=("--sequence-length", "128"), optimizer_values=2, step_counters=True),
}


def _stand_in_data_set(folder: Path) -> None:
    """TinyStories as ``load_dataset("roneneldan/TinyStories")`` finds it offline: a local folder of that name in the
    working directory (a path wins over the Hub), one story a line (the ``text`` builder), of :data:`WORDS`."""
    stories = folder / "roneneldan" / "TinyStories"
    stories.mkdir(parents=True)
    words = WORDS.split()
    (stories / "train.txt").write_text("".join(" ".join(words[(line + step) % len(words)] for step in range(60)) + "\n"
                                               for line in range(24)))


@pytest.mark.extended
@pytest.mark.parametrize("name", list(EXAMPLE_RUNS))
def test_hfs_nd_examples_dry_run_unmodified_with_each_ranks_model_states_as_the_arithmetic(tmp_path, request, name):
    """HF's ``nd_parallel.py`` (the Accelerator, bf16 weights, SGD) and ``nd_parallel_trainer.py`` (Transformers'
    Trainer, its config files) at 8 GPUs, with offline stand-ins for their Hub model (the saved Llama and a word-level
    tokenizer, ``--model-name``), their data set (:func:`_stand_in_data_set`) and W&B (offline): every rank trains,
    with the arithmetic's model states."""
    if not EXAMPLES.is_dir():
        pytest.skip(WITHOUT_EXAMPLES)
    if importlib.util.find_spec("datasets") is None:
        pytest.skip("HF's examples load their data with datasets, which is not installed (pip install datasets)")
    run = EXAMPLE_RUNS[name]
    folder, sizes, tp_plan, env = request.getfixturevalue("llama_for_tensor_parallel")
    _stand_in_data_set(tmp_path)
    config = ["--config_file", str(EXAMPLES / run.config)] if run.config else []
    argv = ["launch", "--simulate", "cuda", "--num_processes", str(run.layout.ranks), *config, *run.launch, "--timeout", "300",
            "--summary-json", "summary.json", str(EXAMPLES / run.script), *run.options, "--model-name", str(folder),
            "--save-dir", str(tmp_path / "outputs")]
    offline = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "HF_HOME": str(tmp_path / "hf_home"), "MLFLOW_TRACKING_URI": (tmp_path / "mlruns").as_uri(),
               "MLFLOW_ALLOW_FILE_STORE": "true"}  # the Trainer reports to every tracker installed
    done = run_module("accelerate_ref.commands.accelerate_cli", *argv, timeout=900, cwd=tmp_path,
                      env={**env, **offline})
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{name}:\n{output[-4000:]}"
    expected = run.layout.model_states(sizes, tp_plan, run.value_bytes, run.optimizer_values)
    expected["optimizer_state"] += 4 * len(sizes) if run.step_counters else 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert len(summary["ranks"]) == run.layout.ranks, summary
    for rank in summary["ranks"]:
        for device, books in rank["memory"].items():
            assert books["model_states"] == expected, (
                f"{name}, rank {rank['rank']} on {device}: model states {books['model_states']}, the arithmetic says "
                f"{expected} (tp {run.layout.tp}, FSDP2 over {run.layout.fsdp})")
