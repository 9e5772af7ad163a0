"""simulators.report and ``--memory-snapshot``: a dry run's HTML report and its ranks' torch memory snapshots
(``accelerate-ref launch --simulate cuda --report PATH.html --memory-snapshot DIR``)."""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from simulators.fork_root import run_module
from tests.simulators.devices.test_history import replay

HAS_PLOTLY = importlib.util.find_spec("plotly") is not None
needs_plotly = pytest.mark.skipif(not HAS_PLOTLY, reason="plotly is not installed (the report extra: pip install 'accelerate-ref[report]')")

FSDP2_TRAIN = textwrap.dedent("""\
    import torch
    from accelerate import Accelerator
    from accelerate.utils import FullyShardedDataParallelPlugin

    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    for step in range(3):
        loss = model(torch.randn(32, 64, device=accelerator.device)).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    """)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """One FSDP2 dry run on 2 mock GPUs with both flags (``--report`` where plotly is installed): (folder, summary
    JSON, process)."""
    folder = tmp_path_factory.mktemp("report")
    (folder / "train.py").write_text(FSDP2_TRAIN)
    done = run_module("accelerate_ref.commands.accelerate_cli", "launch", "--simulate", "cuda", "--num_processes", "2",
                      "--gpu", "l4-24gb", "--summary-json", "summary.json",
                      *(["--report", "out/report.html"] if HAS_PLOTLY else []), "--memory-snapshot", "snapshots",
                      "--timeout", "240", "train.py", timeout=300, cwd=folder)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return folder, json.loads((folder / "summary.json").read_text()), done


def plotted(page: str, div: str) -> list[dict]:
    """The traces plotly's ``Plotly.newPlot("div", [...], ...)`` call in ``page`` draws."""
    start = page.index("[", re.search(r'Plotly\.newPlot\(\s*"' + re.escape(div) + r'",', page).end())
    traces, _ = json.JSONDecoder().raw_decode(page, start)
    return traces


def test_the_snapshots_open_in_torchs_memory_viz_and_peak_where_the_summary_does(dry_run):
    from torch.cuda import _memory_viz

    folder, found, done = dry_run
    assert "memory snapshots: " in done.stdout
    for rank in found["ranks"]:
        device = rank["rank"]
        memory = rank["memory"][f"cuda:{device}"]
        with open(folder / "snapshots" / f"rank{device}.pickle", "rb") as stream:
            snapshot = pickle.load(stream)
        html = _memory_viz.trace_plot(snapshot)  # torch's own viewer, as `python -m torch.cuda._memory_viz trace_plot` runs it
        assert "MemoryViz.js" in html and len(html) > 1000
        assert "total_reserved" in _memory_viz.segsum(snapshot) and "cudaMalloc" in _memory_viz.trace(snapshot)
        trace = snapshot["device_traces"][device]
        assert {event["action"] for event in trace} >= {"segment_alloc", "alloc", "free_requested", "free_completed"}
        assert any(frame["filename"].endswith("train.py") for event in trace for frame in event["frames"])
        most, reserved = replay(snapshot, device)  # consistent as MemoryViz replays it, from the run's first allocation
        assert most == memory["peak"] and reserved == memory["reserved"], (most, reserved, memory)
    out = run_module("torch.cuda._memory_viz", "trace_plot", str(folder / "snapshots" / "rank0.pickle"), "-o",
                     str(folder / "trace.html"), timeout=120)
    assert out.returncode == 0 and (folder / "trace.html").stat().st_size > 1000, out.stderr[-2000:]


@needs_plotly
def test_the_report_plots_each_ranks_peak_as_the_summary_states_it_and_opens_offline(dry_run):
    folder, found, done = dry_run
    page = (folder / "out" / "report.html").read_text()
    assert f"report: {folder / 'out' / 'report.html'}" in done.stdout
    assert not re.search(r"<script[^>]*\bsrc\s*=", page) and not re.search(r"<link[^>]*href\s*=\s*[\"']https?:", page)
    assert "plotly.js" in page.lower()  # the library is inline
    traces = plotted(page, "dry-run-timeline")
    for rank in found["ranks"]:
        memory = rank["memory"][f"cuda:{rank['rank']}"]
        peak, = [t for t in traces if t["meta"]["kind"] == "peak" and t["meta"]["rank"] == rank["rank"]]
        assert peak["customdata"][0][0] == memory["peak"] and peak["meta"]["bytes"] == memory["peak"]
        allocated, = [t for t in traces if t["meta"]["kind"] == "allocated" and t["meta"]["rank"] == rank["rank"]]
        reserved, = [t for t in traces if t["meta"]["kind"] == "reserved" and t["meta"]["rank"] == rank["rank"]]
        scale = peak["y"][0] / memory["peak"]
        assert max(allocated["y"]) == pytest.approx(memory["peak"] * scale)  # the line's highest point is the peak
        assert max(reserved["y"]) == pytest.approx(memory["reserved"] * scale)
        steps, = [t for t in traces if t["meta"]["kind"] == "steps" and t["meta"]["rank"] == rank["rank"]]
        assert [text for text in steps["customdata"] if text][::2] == [f"step {step} begins" for step in (2, 3, 4)]
        assert [text for text in steps["text"] if text] == [f"step {step}" for step in (2, 3, 4)]
        assert memory["at"] in page and f"step {memory['step']}" in page
    bars = plotted(page, "dry-run-breakdown")
    names = [bar["name"] for bar in bars]
    assert names[:3] == ["trainable parameters", "gradients", "optimizer state"] and names[-1] == "other"
    assert json.loads(re.search(r'id="dry-run-summary">(.*?)</script>', page, re.S).group(1)) == found
    assert "fits, " in page and "== dry run summary: 2 ranks as 1 machine(s), ok ==" in page


@needs_plotly
def test_the_report_renders_in_a_headless_browser(dry_run, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no chromium or chromium-browser on PATH: the page is not rendered here")
    folder, _, _ = dry_run
    shot = tmp_path / "report.png"
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,2000",
                           f"--screenshot={shot}", (folder / "out" / "report.html").as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 10_000, done.stderr[-2000:]
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", (folder / "out" / "report.html").as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.stdout.count('class="main-svg"') >= 2, dom.stderr[-2000:]  # plotly drew both figures, offline


@pytest.mark.parametrize("argv, message", [
    (["--simulate", "cuda", "--report", "{file}/report.html"], "--report {file}/report.html: cannot make the folder"),
    (["--simulate", "cuda", "--report", "{tmp}"], "--report {tmp}: a folder; give the HTML file to write"),
    (["--simulate", "cuda", "--memory-snapshot", "{file}/shots"], "--memory-snapshot {file}/shots: cannot make the folder"),
    (["--simulate", "xla", "--memory-snapshot", "shots"], "--memory-snapshot records the CUDA caching allocator's history"),
    (["--report", "r.html"], "--report: only for a dry run"),
    (["--memory-snapshot", "shots"], "--memory-snapshot: only for a dry run"),
])
def test_a_path_that_cannot_be_written_is_one_line_and_exit_2_before_any_rank(tmp_path, monkeypatch, capsys, argv, message):
    from accelerate_ref.commands.accelerate_cli import run

    (tmp_path / "train.py").write_text("raise SystemExit('never run')\n")
    (tmp_path / "plain").write_text("a file, not a folder")
    monkeypatch.chdir(tmp_path)
    fill = {"file": str(tmp_path / "plain"), "tmp": str(tmp_path)}
    assert run(["launch", *(arg.format(**fill) for arg in argv), "train.py"]) == 2
    err = capsys.readouterr().err
    assert message.format(**fill) in err and len(err.strip().splitlines()) == 1, err
    assert not os.path.exists(tmp_path / "shots")


def test_a_report_without_plotly_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    from accelerate_ref.commands.accelerate_cli import run
    from simulators import report

    monkeypatch.setattr(report, "missing_library", lambda: "plotly is not installed: pip install 'accelerate-ref[report]'")
    (tmp_path / "train.py").write_text("raise SystemExit('never run')\n")
    monkeypatch.chdir(tmp_path)
    assert run(["launch", "--simulate", "cuda", "--report", "r.html", "train.py"]) == 2
    err = capsys.readouterr().err
    assert "--report: plotly is not installed: pip install 'accelerate-ref[report]'" in err and not Path("r.html").exists()
