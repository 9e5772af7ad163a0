"""How worlds get a mock device, in this process: ``simulators.devices.world_settings``, the
replicas' view of the launch environment, and the suite's ``sim-xla`` / ``sim-npu`` backends.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from conformance.engine.backends import BACKENDS, SimBackend, SimNpuBackend, SimXlaBackend, make_backend
from conformance.engine.case import Case
from simulators.devices import KINDS, world_settings
from simulators.devices.families.replicas import Replicas


@pytest.mark.parametrize("kind, package", [("xla", "torch_xla"), ("npu", "torch_npu"), ("cuda", "torch_cuda_sim")])
def test_each_family_puts_its_stand_in_package_and_metadata_first(kind, package):
    settings = world_settings(kind)
    site = Path(settings.pythonpath[0])
    assert (site / package / "__init__.py").is_file()
    assert [p.name.split("-")[0] for p in site.glob("*.dist-info")] == [package]
    others = set(KINDS) - {kind}
    assert not any((site / f"torch_{other}").exists() for other in others), "a world sees one family only"


def test_xla_worlds_run_pjrt_on_cpu_devices_and_unknown_kinds_are_refused():
    assert world_settings("xla").env == {"PJRT_DEVICE": "CPU"}
    assert world_settings("npu").env == {}
    assert world_settings("cuda").env == {"PYTORCH_DDP_USE_SIDE_STREAM": "0"}
    with pytest.raises(ValueError, match="unknown mock device 'tpu'"):
        world_settings("tpu")


def test_replicas_follow_the_torchrun_environment(monkeypatch):
    for name, value in {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "1"}.items():
        monkeypatch.setenv(name, value)
    assert Replicas.from_environ() == Replicas(ordinal=3, local_ordinal=1, world_size=4, local_world_size=2, host=1)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK"):
        monkeypatch.delenv(name)
    assert Replicas.from_environ() == Replicas(0, 0, 1, 1, 0)


def test_the_device_backends_are_offered_and_run_their_own_device_cases():
    assert {"sim", "sim-xla", "sim-npu", "native"} <= set(BACKENDS)
    cases = {device: Case("x", print, ("2",), device=device) for device in ("xla", "npu", None)}
    for backend, runs in ((SimBackend, [None]), (SimXlaBackend, ["xla", None]), (SimNpuBackend, ["npu", None])):
        made = make_backend(backend.name, "accelerate_ref", 5.0)
        try:
            assert type(made) is backend
            assert [device for device, case in cases.items() if made.runs(case)] == runs
        finally:
            made.close()
    assert "ACCELERATE_USE_CPU" not in SimNpuBackend.base_env, "HF accelerate would pick the CPU over the NPU"


def test_a_device_backend_deviation_is_not_unused_in_a_run_of_another_backend():
    from conformance.engine.manifest import Manifest
    from conformance.engine.results import CaseResult

    manifest = Manifest.parse(
        '[[deviation]]\nid = "a"\nstatus = "FAIL"\nbackends = ["sim-xla"]\nreason = "r"\n'
        '[[deviation]]\nid = "b"\nstatus = "FAIL"\nreason = "r"\n',
        "inline",
    )
    result = CaseResult.from_json({"id": "c", "case": "c", "world": "2", "backend": "sim", "impl": "x",
                                   "status": "PASS", "message": "", "duration_s": 0.0})
    manifest.apply(result)
    assert [d.id for d in manifest.unused()] == ["b"]
    manifest.apply(CaseResult.from_json({**result.to_json(), "backend": "sim-xla"}))
    assert [d.id for d in manifest.unused()] == ["a", "b"]


def test_a_deviation_of_the_result_backend_explains_it_before_a_general_one():
    from conformance.engine.manifest import Manifest
    from conformance.engine.results import CaseResult

    manifest = Manifest.parse(
        '[[deviation]]\nid = "a"\nstatus = "FAIL"\nreason = "everywhere"\n'
        '[[deviation]]\nid = "a"\nstatus = "NOT_SUPPORTED"\nbackends = ["sim-xla"]\nreason = "xla only"\n'
        '[[deviation]]\nid = "a"\nstatus = "FAIL"\nbackends = ["sim-xla"]\nreason = "xla failure"\n',
        "inline",
    )
    base = {"id": "a", "case": "a", "world": "2", "impl": "x", "message": "", "duration_s": 0.0}
    reasons = {}
    for backend, status in (("sim", "FAIL"), ("sim-xla", "FAIL"), ("sim-xla", "NOT_SUPPORTED")):
        result = manifest.apply(CaseResult.from_json({**base, "backend": backend, "status": status}))
        assert result.status.value == "XFAIL"
        reasons[backend, status] = result.manifest_reason
    assert reasons == {("sim", "FAIL"): "everywhere", ("sim-xla", "FAIL"): "xla failure", ("sim-xla", "NOT_SUPPORTED"): "xla only"}


def test_the_matrix_marks_another_device_family_s_ids_not_applicable():
    from conformance.engine import report
    from conformance.engine.runner import Run

    def run(backend, other):
        return Run({"impl": "x", "impl_version": "1", "backend": backend, "other_device_ids": other}, [])

    columns, cells = report.matrix([run("sim", ["xla.collectives"]), run("sim-xla", [])])
    assert [cells["xla.collectives"][c] for c in columns] == ["n/a", "UNCOVERED"]
