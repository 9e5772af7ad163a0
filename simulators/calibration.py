"""The dry run's memory answer held against a real GPU's: the same script, its peaks as each reports them.

Ground truth is a folder as ``../shared/gpu`` is: ``summary.json`` (``gpu``: the card's name; ``runs``: per
run, ``peak`` = ``torch.cuda.max_memory_allocated()`` and ``reserved`` = ``torch.cuda.max_memory_reserved()``)
and ``capture.py``, the script that measured them (runs one after another in one process; ``CAPTURE_RECORD=0``
skips the allocator snapshots, ``CAPTURE_MODELS`` picks the models, ``OUTDIR`` its one argument). The
prediction is that script dry-run on one mock GPU of the same kind (``accelerate-ref launch --simulate cuda
--gpu <preset>``), whose ``torch.cuda`` reads the memory books: every number comes from the same program on
both sides, no figure from the ground truth enters the prediction.

    rows = compare(load("../shared/gpu/summary.json"), predict("../shared/gpu/summary.json"))
    print(table(rows))
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from simulators.devices.families.machine import GPU_PRESETS

#: The folder ``capture.py`` runs from: it imports ``benchmarks/preflight_models.py`` relative to it.
PROJECT_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Row:
    """One run: the real GPU's and the dry run's allocated and reserved peaks (bytes)."""

    run: str
    real_peak: int
    predicted_peak: int
    real_reserved: int
    predicted_reserved: int

    @property
    def peak_ratio(self) -> float:
        return self.predicted_peak / self.real_peak

    @property
    def reserved_ratio(self) -> float:
        return self.predicted_reserved / self.real_reserved


def load(summary: str | os.PathLike) -> dict:
    """The ground truth in ``summary`` (a ``summary.json``)."""
    with open(summary, encoding="utf-8") as stream:
        return json.load(stream)


def preset_of(gpu_name: str) -> str:
    """The ``--gpu`` preset of a card ``torch.cuda.get_device_name()`` names (``"NVIDIA H200"`` -> ``h200-141gb``,
    ``"NVIDIA A100-SXM4-80GB"`` -> ``a100-80gb``, ``"NVIDIA H100 PCIe"`` -> ``h100-pcie-80gb``); ValueError when none
    matches."""
    name = gpu_name.lower().replace("nvidia", "").strip()
    family = name.replace("-", " ").split()[0] if name else ""
    kinds = [preset for preset in GPU_PRESETS if preset.split("-")[0] == family]
    if kinds:  # the one naming most of the card's words ("pcie", "80gb"); the first of a tie
        return max(kinds, key=lambda preset: sum(part in name for part in preset.split("-")[1:]))
    raise ValueError(f"no --gpu preset for {gpu_name!r}; known: {', '.join(GPU_PRESETS)}")


def predict(summary: str | os.PathLike, *, no_compute: bool = False, timeout: int = 1200) -> dict[str, dict]:
    """Dry-run ``capture.py`` beside ``summary`` on one mock GPU of the summary's kind; its runs' peaks.

    Raises RuntimeError with the dry run's output when it fails."""
    truth = load(summary)
    capture = Path(summary).resolve().with_name("capture.py")
    models = sorted({run.removesuffix("_bf16") for run in truth["runs"]}, key=list(truth["runs"]).index)
    env = {**os.environ, "CAPTURE_RECORD": "0", "CAPTURE_MODELS": ",".join(models)}
    with tempfile.TemporaryDirectory(prefix="calibration-") as folder:
        command = [sys.executable, "-m", "accelerate_ref.commands.accelerate_cli", "launch", "--simulate", "cuda",
                   "--num_processes", "1", "--gpu", preset_of(truth["gpu"]), "--timeout", str(timeout),
                   *(["--no-compute"] if no_compute else []), str(capture), folder]
        done = subprocess.run(command, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=timeout + 60)
        result = Path(folder, "summary.json")
        if done.returncode or not result.exists():
            raise RuntimeError(f"dry run of {capture} failed (exit {done.returncode}):\n{done.stdout[-4000:]}{done.stderr[-2000:]}")
        return load(result)["runs"]


def compare(truth: dict, predicted: dict[str, dict]) -> list[Row]:
    """One :class:`Row` per run of ``truth`` (a run the dry run lacks raises KeyError naming it)."""
    return [Row(name, real["peak"], predicted[name]["peak"], real["reserved"], predicted[name]["reserved"])
            for name, real in truth["runs"].items()]


def table(rows: list[Row]) -> str:
    """``rows`` as a Markdown table: allocated and reserved, real, dry run and their ratio."""
    lines = ["| run | allocated, GPU | dry run | ratio | reserved, GPU | dry run | ratio |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {row.run} | {row.real_peak:,} | {row.predicted_peak:,} | {row.peak_ratio:.3f} | "
              f"{row.real_reserved:,} | {row.predicted_reserved:,} | {row.reserved_ratio:.3f} |" for row in rows]
    return "\n".join(lines)


__all__ = ["Row", "load", "preset_of", "predict", "compare", "table"]
