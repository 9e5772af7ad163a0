"""Cases whose outcome cannot depend on the device family run once per ``make conformance``: the rows of
``conformance/device_independent.toml`` are left out of the later backends' runs (``--skip-device-independent``),
named in their header and shown as such in the matrix; on every backend they give the same statuses."""

from __future__ import annotations

import io

import pytest

from conformance import catalog
from conformance.engine import report
from conformance.engine.case import all_cases
from conformance.engine.runner import RunOptions, device_independent_ids, execute


def test_every_listed_row_exists_has_cases_and_a_reason():
    covered = {case.id for case in all_cases()}
    for catalog_id, reason in device_independent_ids().items():
        assert catalog_id in catalog.by_id() and catalog_id in covered, catalog_id
        assert reason.strip(), f"{catalog_id} needs its reason"


def test_a_later_backend_leaves_the_listed_rows_to_the_first():
    out = io.StringIO()
    run = execute(RunOptions(impl="accelerate_ref", backend="sim-npu", worlds=["1"], skip_device_independent=True,
                             patterns=["launch.config_location", "npu.distributed_type", "process.on_main_process"]),
                  out=out)
    assert {result.id for result in run.results} <= {"npu.distributed_type", "process.on_main_process"}, run.results
    assert run.metadata["device_independent_ids"] == ["launch.config_location"]
    assert "left to another backend (device-independent): launch.config_location" in out.getvalue()
    columns, cells = report.matrix([run])
    assert cells["launch.config_location"][columns[0]] == "device-independent"


@pytest.mark.extended
def test_the_listed_rows_give_the_same_statuses_on_every_backend():
    patterns = list(device_independent_ids())
    statuses = {}
    for backend in ("sim", "sim-xla", "sim-npu"):
        run = execute(RunOptions(impl="accelerate_ref", backend=backend, worlds=["1", "2", "4", "2x2"], patterns=patterns),
                      out=io.StringIO())
        statuses[backend] = {(result.case, result.world): result.status.value for result in run.results}
    assert statuses["sim"], "no listed case ran"
    assert statuses["sim-xla"] == statuses["sim"] and statuses["sim-npu"] == statuses["sim"], statuses
