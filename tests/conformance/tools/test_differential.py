"""The behavioural differential (issue 20, item 1): accelerate_ref against HF accelerate, and the harness itself.

* the whole probe set, every setting, through the command line: no unexplained difference, no stale deviation;
* meta-tests: the harness catches a broken copy of accelerate_ref (a changed message, a lost isinstance, a
  swallowed warning), where accelerate_ref against itself shows nothing on the same probes;
* the parts: normalised texts, comparison, deviation matching and staleness, the command line's refusals.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from simulators.fork_root import run_module
from conformance.tools.differential import deviations
from conformance.tools.differential.observe import ClassIndex, Normaliser
from conformance.tools.differential.probe import Api, Probe, Subject, run_probe
from conformance.tools.differential.probes.parallelism_config_meshes import COMBINATIONS, describe_mesh, fake_world
from conformance.tools.differential.runner import _within, compare, run

ROOT = Path(__file__).resolve().parents[3]
META_DIR = ROOT / "tests" / "conformance" / "meta"
REFERENCE = "accelerate_ref"
#: The first line of a finding in the command's report: probe, setting, rank and label.
FINDING_HEADER = re.compile(r"^\S+ \[(cpu|cuda)/\d+ rank \d+\] ")


def _cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return run_module("conformance", "differential", *args, timeout=timeout, cwd=ROOT)


@pytest.mark.slow
@pytest.mark.longest
@pytest.mark.timeout(900)
def test_accelerate_ref_behaves_as_hf_accelerate_on_every_probe() -> None:
    finished = _cli("--impl", REFERENCE, "--against", "accelerate")
    headers = [line for line in finished.stdout.splitlines() if FINDING_HEADER.match(line)]
    assert finished.returncode == 0, (
        "differences found:\n" + "\n".join(headers) + f"\n\nin full:\n{finished.stdout[-20000:]}\n{finished.stderr[-3000:]}")
    assert "0 unexplained difference(s)" in finished.stdout


# -- meta-tests: probes of real public behaviour, a broken copy of the reference against the reference ----

def _register_refusal(api: Api) -> None:
    accelerator = api.accelerator()
    api.observe("an object without state_dict", accelerator.register_for_checkpointing, object())


def _prepared_optimizer(api: Api) -> None:
    accelerator = api.accelerator()
    model = torch.nn.Linear(2, 1)
    api.record("prepared optimizer", accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1)))


def _autocast_cache_enabled(api: Api) -> None:
    accelerator = api.accelerator()
    api.observe("autocast(cache_enabled=True)", accelerator.autocast, cache_enabled=True)


def _mesh_of_context_and_tensor_parallelism(api: Api) -> None:
    config = api.get("ParallelismConfig")(dp_shard_size=2, cp_size=2, tp_size=2)
    with fake_world(8, 3):
        api.observe("mesh at rank 3 of 8", lambda: describe_mesh(config.get_device_mesh("cpu")))


META_PROBES = [Probe(f"meta.{function.__name__.lstrip('_')}", "meta", function)
               for function in (_register_refusal, _prepared_optimizer, _autocast_cache_enabled,
                                _mesh_of_context_and_tensor_parallelism)]


@pytest.fixture
def broken_impls_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(META_DIR))


def test_the_reference_against_itself_shows_no_difference() -> None:
    report = run(REFERENCE, REFERENCE, META_PROBES, [], settings=("cpu/1",))
    assert report.findings == [], report.text()
    assert report.runs == {"cpu/1": len(META_PROBES)}


DIFFERENTIAL_BREAKS = [
    ("diff_message_changed", "meta.register_refusal", "an object without state_dict", "raises"),
    ("diff_isinstance_lost", "meta.prepared_optimizer", "prepared optimizer", "value"),
    ("diff_warning_swallowed", "meta.autocast_cache_enabled", "autocast(cache_enabled=True)", "warnings"),
    ("diff_mesh_in_constructor_order", "meta.mesh_of_context_and_tensor_parallelism", "mesh at rank 3 of 8", "value"),
]


def test_every_differential_break_is_planned() -> None:
    """Each ``broken_impls/diff_*`` module is run here (meta/test_suite.py plans the others)."""
    modules = {path.stem for path in (META_DIR / "broken_impls").glob("diff_*.py")}
    assert modules == {broken for broken, *_ in DIFFERENTIAL_BREAKS}


@pytest.mark.usefixtures("broken_impls_importable")
@pytest.mark.parametrize(("broken", "probe", "label", "what"), DIFFERENTIAL_BREAKS)
def test_a_broken_implementation_is_caught(broken: str, probe: str, label: str, what: str) -> None:
    report = run(f"broken_impls.{broken}", REFERENCE, META_PROBES, [], settings=("cpu/1",))
    assert [(f.probe, f.label) for f in report.unexplained] == [(probe, label)], report.text()
    finding = report.unexplained[0]
    assert finding.reference.get(what) != finding.candidate.get(what), (
        f"the difference should be in {what!r}:\n{finding.text()}")


@pytest.mark.usefixtures("broken_impls_importable")
def test_a_lost_isinstance_names_the_classes_lost() -> None:
    report = run("broken_impls.diff_isinstance_lost", REFERENCE, META_PROBES[1:2], [], settings=("cpu/1",))
    finding = report.unexplained[0]
    assert "optimizer.AcceleratedOptimizer" in finding.reference["value"]["is"]
    assert "torch.optim.optimizer.Optimizer" in finding.reference["value"]["bases"]
    assert finding.candidate["value"]["is"] == [] and finding.candidate["value"]["type"] == "OptimizerView"


@pytest.mark.usefixtures("broken_impls_importable")
def test_a_listed_deviation_explains_and_an_unused_one_is_stale() -> None:
    entries = [deviations.Deviation("meta.register_*", "reworded on purpose", "an object without state_dict"),
               deviations.Deviation("meta.prepared_optimizer", "nothing differs here")]
    report = run("broken_impls.diff_message_changed", REFERENCE, META_PROBES, entries, settings=("cpu/1",))
    assert report.unexplained == [] and [f.reason for f in report.findings] == ["reworded on purpose"]
    assert report.stale == [entries[1]] and not report.ok


# -- the parts ------------------------------------------------------------------------------------------

def test_texts_read_the_implementation_name_as_the_reference_and_hide_paths_and_addresses() -> None:
    normaliser = Normaliser({"accelerate_ref": "accelerate"}, [], ["/tmp/differential-x1"])
    text = "accelerate_ref.utils.gather at 0x7f3a2b4c5d6e failed in /tmp/differential-x1/ckpt (not my_accelerate_ref)"
    assert normaliser.text(text) == "accelerate.utils.gather at 0x? failed in <tmp>/ckpt (not my_accelerate_ref)"


def test_the_parallelism_combinations_are_every_size_tuple_of_one_to_eight_ranks() -> None:
    products = [torch.tensor(sizes).prod().item() for sizes in COMBINATIONS]
    assert len(COMBINATIONS) == len(set(COMBINATIONS)) == 96 and sorted(set(products)) == list(range(1, 9))
    assert all(len(sizes) == 5 and min(sizes) >= 1 for sizes in COMBINATIONS)


def test_a_fake_world_builds_a_real_mesh_and_leaves_no_process_group_or_hook_behind() -> None:
    hook = sys.excepthook
    with fake_world(6, 4):
        mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (3, 2), mesh_dim_names=("a", "b"))
        assert describe_mesh(mesh) == {"device_type": "cpu", "names": ("a", "b"), "grid": [[0, 1], [2, 3], [4, 5]],
                                       "coordinate": (2, 0), "a": ([0, 2, 4], 2), "b": ([4, 5], 0),
                                       "dp": "KeyError", "dp_shard_cp": "KeyError", "dp_cp": "KeyError"}
    assert not torch.distributed.is_initialized() and sys.excepthook is hook


def test_tensors_compare_by_dtype_device_shape_and_exact_values() -> None:
    normaliser = Normaliser({}, [])
    assert normaliser.value(torch.tensor([1.0, 2.0])) != normaliser.value(torch.tensor([1.0, 2.0000002]))
    assert normaliser.value(torch.tensor([1.0])) != normaliser.value(torch.tensor([1.0], dtype=torch.float64))
    assert normaliser.value(torch.zeros(100)) != normaliser.value(torch.zeros(101))
    assert normaliser.value(torch.zeros(100))["sha1"] == normaliser.value(torch.zeros(100))["sha1"]


def test_compare_reports_each_differing_or_one_sided_label_in_order() -> None:
    reference = [("a", {"value": 1}), ("b", {"value": 2}), ("c", {"value": 3})]
    candidate = [("a", {"value": 1}), ("b", {"value": 5}), ("d", {"value": 4})]
    assert compare(reference, candidate) == [("b", {"value": 2}, {"value": 5}), ("c", {"value": 3}, None),
                                             ("d", None, {"value": 4})]


def test_a_deviation_file_without_a_reason_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "d.toml"
    path.write_text('[[deviation]]\nprobe = "x.y"\n', encoding="utf-8")
    with pytest.raises(deviations.DeviationFileError, match="needs a probe and a reason"):
        deviations.load(path)


@pytest.mark.parametrize(("args", "message"), [
    (["--settings", "tpu/8"], "unknown setting 'tpu/8'"),
    (["-k", "no_probe_is_called_this"], "no probe matches"),
    (["--impl", "no_such_implementation", "-k", "gather"], "cannot import the implementation under test"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    finished = _cli(*args, timeout=120)
    assert finished.returncode == 2, finished.stdout + finished.stderr
    assert message in finished.stderr and len(finished.stderr.strip().splitlines()) == 1, finished.stderr


def _sleeps(api: Api) -> None:
    import time

    api.observe("a call that never returns", time.sleep, 60)


def test_a_probe_past_its_timeout_ends_with_its_stack() -> None:
    subject = Subject(REFERENCE, REFERENCE, ClassIndex.of_public_api())
    seen = _within(0.5, run_probe, Probe("meta.sleeps", "meta", _sleeps), subject)
    assert seen[0][0] == "probe" and "past 0.5 s" in seen[0][1]["timeout"] and "_sleeps" in seen[0][1]["timeout"]


def _misspelt(api: Api) -> None:
    api.accelerator()
    undefined_model()  # noqa: F821 - the probe's own bug


def _implementation_refuses(api: Api) -> None:
    api.get("Accelerator")(gradient_accumulation_steps=0)  # raised inside the implementation: an observation


def test_a_probe_whose_own_code_raises_is_reported_even_when_both_sides_agree() -> None:
    probes = [Probe("meta.misspelt", "meta", _misspelt), Probe("meta.refused", "meta", _implementation_refuses)]
    report = run(REFERENCE, REFERENCE, probes, [], settings=("cpu/1",))
    assert [(f.probe, f.label, f.deviation) for f in report.findings] == [
        ("meta.misspelt", "the probe itself, under the reference", None)], report.text()
    assert "NameError: name 'undefined_model' is not defined (test_differential.py:" in report.findings[0].reference
