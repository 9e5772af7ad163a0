"""The setup matrix of issue 22 item 1 (setup x implementation x device family): one training script per setup,
written for HF accelerate and switched to accelerate_ref, dry-run on 2 mock devices (4 as 2 machines for hybrid
sharding) until it ends well, with the model states the arithmetic gives (item 4: parameters, gradients and AdamW's
two moments at 4 bytes a parameter, divided by the shard count for FSDP and ZeRO, none on the device with CPU offload).

A setup is given as the script's ``Accelerator`` arguments, or as an ``accelerate config`` file for
``accelerate-ref launch --config_file`` with a plain ``Accelerator()``. A family runs the setups its real hardware
runs (XLA: no torch FSDP, fp16 or torch.compile through accelerate). A setup a GPU would run but the mock cannot is a
strict xfail naming torch's mechanism that refuses it (and a limit in the README), never a silent pass. Each run
starts its ranks (about 10 s): ``make test`` runs ``SMOKE`` (every setup once), ``make extended`` the whole product.

Elsewhere: ``save_state``/``load_state`` and resuming, ``torch.load``/safetensors onto the device, out-of-memory and
collectives and ``torch.profiler`` (under ``make extended``) in ``test_dry_run.py``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import textwrap

import pytest
import yaml

from accelerate_ref.commands.accelerate_cli import run

SCRIPT = textwrap.dedent("""\
    import torch
    from {package} import Accelerator
    from {package}.parallelism_config import ParallelismConfig  # noqa: F401
    from {package}.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin, TorchDynamoPlugin  # noqa: F401

    accelerator = Accelerator({accelerator})
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 8)), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for (batch,) in loader:
        with accelerator.accumulate(model):
            loss = model(batch).float().pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    print("trained", accelerator.distributed_type, accelerator.mixed_precision, accelerator.device.type, flush=True)
    """)


@dataclasses.dataclass(frozen=True)
class Setup:
    """One row of the matrix: the script's ``Accelerator`` arguments or a config file, the world, the families."""

    accelerator: str = ""
    config: dict | None = None
    ranks: int = 2
    machines: int = 1
    families: tuple[str, ...] = ("cuda",)
    #: The distributed type the ranks must report (a config that ran as plain DDP would pass otherwise).
    distributed_type: str = "MULTI_GPU"
    #: The engine package the setup needs (absent: the run is skipped naming it).
    needs: str | None = None
    #: DeepSpeed's ZeRO stage, where DeepSpeed trains.
    zero_stage: int | None = None
    #: The model states live on the CPU (CPU offload): none on the device.
    offloaded: bool = False

    @property
    def shards(self) -> int:
        """How many ways the optimizer's parameters, their gradients and its state are split: FSDP and ZeRO shard
        over 2 ranks here (hybrid sharding: 2 shards, each held by 2 machines)."""
        return 2 if self.distributed_type in ("FSDP", "DEEPSPEED") else 1

    def model_states(self, rank: int, sizes: tuple[int, ...] | None = None) -> dict[str, int]:
        """Bytes of each model-state part device ``rank`` holds after a step of a model of parameters of ``sizes``
        elements (default: the script's, :data:`SIZES`): fp32 parameters and gradients, AdamW's
        two fp32 moments (its step count stays on the CPU). DeepSpeed keeps the optimizer's fp32 master weights as
        a copy of the rank's partition: ZeRO-1/2 always clones it (deepspeed/runtime/zero/stage_1_and_2.py:
        ``weights_partition``), and so does ZeRO-3, whose test for sharing compares a ``torch.device`` with the
        device's name, never equal (stage3.py: ``fp32_partitioned_groups_flat``). ZeRO-1 and 2: every rank keeps
        the whole model (its flattened parameters) beside it; a rank whose partition of the flattened model falls
        inside one parameter steps on a view of that parameter's gradient, which keeps the whole of it; another
        steps on a flat copy of its partition. ZeRO-3: the gradient partitions' buffer and the flat fp32 copy of
        them the step gives the master weights (stage3.py: ``_prepare_fp32_grad_for_sub_group``)."""
        sizes = sizes or SIZES
        total = sum(sizes)
        size = 0 if self.offloaded else total * 4 // self.shards
        gradients, parameters = size, size
        if self.zero_stage == 3:
            gradients, parameters = 2 * size, 2 * size
        elif self.zero_stage is not None:
            parameters = total * 4 + size
            start, end = rank * total // self.shards, (rank + 1) * total // self.shards
            offsets = [sum(sizes[:index]) for index in range(len(sizes))]
            overlapping = [n for n, offset in zip(sizes, offsets) if offset < end and offset + n > start]
            gradients = 4 * overlapping[0] if len(overlapping) == 1 else size
        return {"trainable_parameters": parameters, "frozen_parameters": 0, "quantized_weights": 0, "gradients": gradients,
                "optimizer_state": 2 * size}


#: The sizes of the script's parameters: two Linear layers (8 -> 16 -> 4) with biases; every dimension splits evenly
#: in two.
SIZES = (8 * 16, 16, 16 * 4, 4)
PARAMETERS = sum(SIZES)
FSDP2 = "fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2{})"
FSDP1 = "fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=1{})"
ALL = ("cuda", "npu", "xla")
GPUS = ("cuda", "npu")


def _fsdp_config(fsdp: dict, **top) -> dict:
    return {"compute_environment": "LOCAL_MACHINE", "distributed_type": "FSDP", "mixed_precision": "no", "use_cpu": False,
            "fsdp_config": fsdp, **top}


SETUPS = {
    "ddp": Setup(families=ALL),
    "ddp-bf16": Setup('mixed_precision="bf16"', families=ALL),
    "ddp-fp16": Setup('mixed_precision="fp16"', families=GPUS),
    "ddp-accumulation": Setup("gradient_accumulation_steps=2", families=ALL),
    "ddp-compile": Setup('dynamo_plugin=TorchDynamoPlugin(backend="eager")'),
    "fsdp2-full-shard": Setup(FSDP2.format(""), families=GPUS, distributed_type="FSDP"),
    "fsdp2-shard-grad-op": Setup(FSDP2.format(", reshard_after_forward=False"), distributed_type="FSDP"),
    "fsdp2-bf16": Setup(FSDP2.format("") + ', mixed_precision="bf16"', families=GPUS, distributed_type="FSDP"),
    "fsdp2-cpu-offload": Setup(FSDP2.format(", cpu_offload=True"), distributed_type="FSDP", offloaded=True),
    "fsdp2-hybrid-2-machines": Setup(FSDP2.format("") + ", parallelism_config=ParallelismConfig(dp_replicate_size=2, dp_shard_size=2)",
                                     ranks=4, machines=2, distributed_type="FSDP"),
    # HF 1.15 checkpoints the layers its wrap policy picks, and fails without one (on a GPU too).
    "fsdp2-activation-checkpointing": Setup(FSDP2.format(', activation_checkpointing=True, auto_wrap_policy="size_based_wrap", '
                                                         "min_num_params=64"), distributed_type="FSDP"),
    "fsdp2-config-file": Setup(config=_fsdp_config({"fsdp_version": 2, "fsdp_reshard_after_forward": False,
                                                    "fsdp_offload_params": False}, mixed_precision="bf16"),
                               families=GPUS, distributed_type="FSDP"),
    "fsdp2-config-file-hybrid-2-machines": Setup(
        config=_fsdp_config({"fsdp_version": 2, "fsdp_auto_wrap_policy": "SIZE_BASED_WRAP", "fsdp_min_num_params": 64},
                            parallelism_config={"parallelism_config_dp_replicate_size": 2, "parallelism_config_dp_shard_size": 2}),
        ranks=4, machines=2, distributed_type="FSDP"),
    "fsdp1-full-shard": Setup(FSDP1.format(""), families=GPUS, distributed_type="FSDP"),
    "fsdp1-config-file-shard-grad-op": Setup(config=_fsdp_config({"fsdp_version": 1, "fsdp_sharding_strategy": "SHARD_GRAD_OP"}),
                                             distributed_type="FSDP"),
    **{f"deepspeed-zero{stage}": Setup(f"deepspeed_plugin=DeepSpeedPlugin(zero_stage={stage}, gradient_accumulation_steps=1)",
                                       distributed_type="DEEPSPEED", needs="deepspeed", zero_stage=stage) for stage in (1, 2, 3)},
    # launch's DeepSpeed path: the config's settings reach the ranks' environment, whose DeepSpeedPlugin the
    # Accelerator makes (as `accelerate launch --use_deepspeed --zero_stage N` gives them).
    **{f"deepspeed-zero{stage}-config-file": Setup(
        config={"compute_environment": "LOCAL_MACHINE", "distributed_type": "DEEPSPEED", "mixed_precision": "no", "use_cpu": False,
                "deepspeed_config": {"zero_stage": stage, "gradient_accumulation_steps": 1}},
        distributed_type="DEEPSPEED", needs="deepspeed", zero_stage=stage) for stage in (2, 3)},
}
#: Setups a GPU runs and the mock cannot, with torch's mechanism that refuses them (README, "Limits").
LIMITS = {
    "ddp-compile": "torch.compile traces with fake tensors on the meta device; dynamo then sets a mock tensor's "
                   "storage to a meta storage, which torch refuses ('the devices must match')",
}
#: Setups whose HF-accelerate script trains nothing, as on a GPU: HF 1.15's FSDP1 plugin defaults to
#: ``use_orig_params=False`` and does not give an optimizer made before ``prepare`` the flat parameters, so the
#: optimizer keeps the original, unsharded parameters, which never get a gradient (no state is made either), beside
#: the FSDP module's sharded flat parameter and its gradient. The dry run's model states show it; accelerate_ref hands
#: the optimizer the sharded parameters.
HF_OPTIMIZER_ORPHANED = {"fsdp1-full-shard"}
#: How the XLA family reports its distributed type.
FAMILY_TYPES = {"xla": {"MULTI_GPU": "XLA"}, "npu": {"MULTI_GPU": "MULTI_NPU"}}


PACKAGES = ("accelerate", "accelerate_ref")


#: The runs ``make test`` makes, (setup, family, implementation): every setup once but the limit (its strict xfail runs
#: under ``make extended``), HF's script and the accelerate_ref twin in turn, every family and both implementations
#: on each family; ``make extended`` runs the whole product.
SMOKE = {
    ("ddp", "cuda", "accelerate"), ("ddp-bf16", "npu", "accelerate_ref"), ("ddp-fp16", "cuda", "accelerate"),
    ("ddp-accumulation", "xla", "accelerate_ref"), ("ddp-bf16", "xla", "accelerate"),
    ("fsdp2-full-shard", "cuda", "accelerate_ref"), ("fsdp2-shard-grad-op", "cuda", "accelerate"),
    ("fsdp2-bf16", "npu", "accelerate"), ("fsdp2-cpu-offload", "cuda", "accelerate_ref"),
    ("fsdp2-hybrid-2-machines", "cuda", "accelerate_ref"), ("fsdp2-activation-checkpointing", "cuda", "accelerate"),
    ("fsdp2-config-file", "cuda", "accelerate_ref"), ("fsdp2-config-file-hybrid-2-machines", "cuda", "accelerate"),
    ("fsdp1-full-shard", "npu", "accelerate_ref"), ("fsdp1-config-file-shard-grad-op", "cuda", "accelerate"),
    ("deepspeed-zero1", "cuda", "accelerate"), ("deepspeed-zero2", "cuda", "accelerate_ref"), ("deepspeed-zero3", "cuda", "accelerate"),
    ("deepspeed-zero2-config-file", "cuda", "accelerate"),
}


def _cases():
    for name, setup in SETUPS.items():
        for family in setup.families:
            for package in PACKAGES:
                marks = [pytest.mark.xfail(strict=True, reason=LIMITS[name])] if name in LIMITS else []
                if setup.needs and importlib.util.find_spec(setup.needs) is None:
                    marks.append(pytest.mark.skip(reason=f"{setup.needs} is not installed (the {setup.needs} extra)"))
                if (name, family, package) not in SMOKE:
                    marks.append(pytest.mark.extended)
                yield pytest.param(name, family, package, marks=marks, id=f"{name}-{family}-{package}")


def dry_run_setup(tmp_path, monkeypatch, capsys, name: str, family: str, package: str) -> str:
    """Dry-run setup ``name`` of the matrix for ``package`` on ``family``'s mock devices (the launcher in this
    process: its start would cost as much as a rank's); check every rank trained; return the output."""
    setup = SETUPS[name]
    (tmp_path / "train.py").write_text(SCRIPT.format(package=package, accelerator=setup.accelerator))
    config = []
    if setup.config is not None:
        (tmp_path / "config.yaml").write_text(yaml.safe_dump({**setup.config, "num_processes": setup.ranks,
                                                              "num_machines": setup.machines}))
        config = ["--config_file", "config.yaml"]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    status = run(["launch", *config, "--simulate", family, "--num_processes", str(setup.ranks),
                  "--num_machines", str(setup.machines), "--timeout", "240", "--summary-json", "summary.json", "train.py"])
    output = capsys.readouterr()
    assert status == 0, f"{name} ({package} on {family}):\n{output.out[-3000:]}{_crash_or_tail(output.err)}"
    distributed_type = FAMILY_TYPES.get(family, {}).get(setup.distributed_type, setup.distributed_type)
    for rank in range(setup.ranks):
        assert f"[rank {rank}] trained DistributedType.{distributed_type}" in output.out, output.out[-3000:]
    assert "-- memory per rank" in output.out
    summary = json.loads((tmp_path / "summary.json").read_text())
    for rank in summary["ranks"]:
        expected = setup.model_states(rank["rank"] % 2)  # hybrid sharding: ranks 2 and 3 hold 0's and 1's shards
        if package == "accelerate" and name in HF_OPTIMIZER_ORPHANED:
            shard = PARAMETERS * 4 // setup.shards  # the FSDP module's flat parameter, which gets the gradients
            expected = {"trainable_parameters": PARAMETERS * 4 + shard, "frozen_parameters": 0, "quantized_weights": 0,
                        "gradients": shard, "optimizer_state": 0}
        for device, books in rank["memory"].items():
            assert books["model_states"] == expected, (
                f"{name} ({package} on {family}), rank {rank['rank']} on {device}: model states after a step "
                f"{books['model_states']}, the arithmetic says {expected} ({PARAMETERS} fp32 parameters, "
                f"{setup.shards} shard(s){', offloaded' if setup.offloaded else ''})")
    return output.out


def _crash_or_tail(err: str) -> str:
    """A crashed rank's fatal-error report (faulthandler's: the signal, then every thread's stack, up to its list of
    extension modules), else the last lines of the ranks' error output."""
    start = err.rfind("Fatal Python error")
    if start < 0:
        return err[-2000:]
    end = err.find("Extension modules", start)
    return err[start:end if end >= 0 else None][:6000]


@pytest.mark.parametrize("name, family, package", list(_cases()))
def test_setup_dry_runs_on_mock_devices(tmp_path, monkeypatch, capsys, name, family, package):
    dry_run_setup(tmp_path, monkeypatch, capsys, name, family, package)
