"""Manifests, reports, the packaged catalog and the command line of the suite."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from simulators.fork_root import run_module
from conformance import catalog
from conformance.__main__ import main
from conformance.engine import report
from conformance.engine.manifest import Manifest
from conformance.engine.results import CaseResult, RankReport, Status
from conformance.engine.runner import Run

SHARED_CATALOG = Path(__file__).resolve().parents[3] / "shared" / "CATALOG.md"


def result(id_: str, status: Status, world: str = "2", **extra) -> CaseResult:
    return CaseResult(
        id=id_, case=id_.replace(".", "_"), status=status, world=world, backend="sim", impl="impl",
        duration_s=0.1, message=extra.pop("message", ""), ranks=[RankReport(0, status)], **extra,
    )


def make_run(*results: CaseResult) -> Run:
    meta = {"impl": "impl", "impl_version": "1.0", "backend": "sim", "worlds": ["1", "2"], "duration_s": 1.0}
    return Run(meta, list(results))


@pytest.mark.skipif(not SHARED_CATALOG.exists(), reason="shared/CATALOG.md not beside the checkout")
def test_packaged_catalog_is_the_shared_one():
    packaged = Path(catalog.__file__).with_name("catalog.md").read_text(encoding="utf-8")
    assert packaged == SHARED_CATALOG.read_text(encoding="utf-8"), "copy shared/CATALOG.md to conformance/catalog.md"


def test_catalog_parses_every_row_with_its_area():
    entries = catalog.by_id()
    assert entries["gather.doc_example"].area == "Collectives"
    assert entries["gather.doc_example"].world == "4"
    assert entries["split.padding"].area == "Inference helpers"
    assert len(entries) == len(catalog.entries()), "catalog IDs are unique"


def test_an_id_repeated_in_a_later_section_is_one_entry_in_its_last_place():
    markdown = "## Utilities (U)\n| a.b | 1 | first |\n## Launching (Q)\n| c.d | 2 | other |\n| a.b | 1 | fuller |\n"
    assert [(e.id, e.area, e.text) for e in catalog.parse(markdown)] == [
        ("c.d", "Launching", "other"), ("a.b", "Launching", "fuller")]
    assert catalog.by_id()["config.write_basic_config"].area == "Launching"


MANIFEST = """
[[deviation]]
id = "reduce.none"
status = "FAIL"
reason = "sums instead"

[[deviation]]
id = "split.padding"
status = "ERROR"
worlds = ["4"]
reason = "only at 4"

[[deviation]]
id = "gather.nested"
status = "FAIL"
case = "gather_nested_tuples"
reason = "one case of the ID only"

[[deviation]]
id = "never.run"
status = "HANG"
reason = "matches nothing"
"""


def test_manifest_marks_expected_failures_and_unexpected_passes():
    manifest = Manifest.parse(MANIFEST, "test.toml")
    failed = manifest.apply(result("reduce.none", Status.FAIL))
    assert (failed.status, failed.manifest_reason) == (Status.XFAIL, "sums instead")
    passed = manifest.apply(result("reduce.none", Status.PASS, world="3"))
    assert passed.status == Status.PASS and passed.unexpected_pass
    other_world = manifest.apply(result("split.padding", Status.ERROR, world="2"))
    assert other_world.status == Status.ERROR, "a deviation limited to world 4 must not excuse world 2"
    different_status = manifest.apply(result("reduce.none", Status.HANG))
    assert different_status.status == Status.HANG, "a HANG is not the FAIL the manifest expects"
    other_case = manifest.apply(result("gather.nested", Status.FAIL))
    assert other_case.status == Status.FAIL, "a deviation naming one case must not excuse another case of the ID"
    named_case = manifest.apply(replace(result("gather.nested", Status.FAIL), case="gather_nested_tuples"))
    assert named_case.status == Status.XFAIL
    assert manifest.expects(result("reduce.none", Status.FAIL), Status.FAIL)
    assert not manifest.expects(result("reduce.none", Status.HANG), Status.HANG), "the deviation expects FAIL"
    assert [d.id for d in manifest.unused()] == ["never.run"], "split.padding is limited to world 4, which has not run"
    manifest.apply(result("other.id", Status.PASS, world="4"))
    assert [d.id for d in manifest.unused()] == ["split.padding", "never.run"]


@pytest.mark.parametrize(
    "text, message",
    [
        ('[[deviation]]\nid = "x"\nstatus = "FAIL"\n', "lacks reason"),
        ('[[deviation]]\nid = "x"\nstatus = "BROKEN"\nreason = "r"\n', "unknown status 'BROKEN'"),
    ],
)
def test_bad_manifest_entries_are_named(text, message):
    with pytest.raises(ValueError, match=message):
        Manifest.parse(text, "bad.toml")


def test_bundled_accelerate_manifest_lists_catalog_ids_with_reasons():
    manifest = Manifest.bundled("accelerate")
    assert manifest is not None and manifest.deviations
    ids = catalog.by_id()
    for deviation in manifest.deviations:
        assert deviation.id in ids, f"{deviation.id} is not a catalog ID"
        assert len(deviation.reason) > 20, f"{deviation.id}: give a real reason"


def test_json_roundtrip_and_junit(tmp_path):
    run = make_run(
        result("gather.nested", Status.PASS),
        result("reduce.none", Status.FAIL, message="sums"),
        result("split.padding", Status.HANG, stacks={1: "File x, line 1 in stuck"}),
        result("pad.doc_example", Status.NOT_SUPPORTED),
    )
    report.write_json(run, tmp_path / "run.json")
    again = report.read_json(tmp_path / "run.json")
    assert [r.to_json() for r in again.results] == [r.to_json() for r in run.results]
    report.write_junit(run, tmp_path / "run.xml")
    suite = ET.parse(tmp_path / "run.xml").getroot()
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("4", "1", "1", "1")
    assert suite.find("testcase[@classname='reduce.none']/failure").text == "sums"


def test_matrix_has_every_catalog_id_and_worlds_where_statuses_differ(tmp_path):
    ref = make_run(result("gather.nested", Status.PASS, "1"), result("gather.nested", Status.FAIL, "2"))
    other = make_run(result("gather.nested", Status.PASS, "1"))
    other.metadata["impl"] = "other"
    report.write_markdown([ref, other], tmp_path / "m.md")
    text = (tmp_path / "m.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| gather.nested "))
    assert row == "| gather.nested | Collectives | PASS 1 / FAIL 2 | PASS |"
    assert "| reduce.none | Collectives | UNCOVERED | UNCOVERED |" in text
    assert sum(line.startswith("| ") for line in text.splitlines()) == len(catalog.entries()) + 1
    report.write_html([ref, other], tmp_path / "m.html")
    assert "<code>gather.nested</code>" in (tmp_path / "m.html").read_text()


def test_list_names_every_catalog_id(capsys):
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    listed = {line.split()[0] for line in lines if line and not line[0].isdigit()}
    assert set(catalog.by_id()) <= listed
    assert any(line.startswith("state.attributes") and "test_process:state_attributes" in line for line in lines)
    assert [line for line in lines if line.endswith("UNCOVERED")] == [], "every catalog ID has a case"


@pytest.mark.slow
def test_cli_run_writes_reports_and_echoes_the_implementation(tmp_path):
    out = tmp_path / "run.json"
    proc = run_module("conformance", "run", "-k", "process.is_main", "--worlds", "1,2", "--json", str(out),
                      "--markdown", str(tmp_path / "m.md"), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "impl=accelerate_ref 0.1.0" in proc.stdout and "backend=sim" in proc.stdout
    data = json.loads(out.read_text())
    assert data["metadata"]["impl"] == "accelerate_ref"
    assert [(r["id"], r["world"], r["status"]) for r in data["results"]] == [
        ("process.is_main", "1", "PASS"), ("process.is_main", "2", "PASS"),
    ]


def test_cli_run_with_an_unknown_implementation_says_so():
    proc = run_module("conformance", "run", "--impl", "no_such_impl_module", timeout=120)
    assert proc.returncode == 2
    assert "cannot import the implementation under test 'no_such_impl_module'" in proc.stderr


@pytest.mark.slow
def test_pytest_plugin_runs_cases_as_items():
    proc = run_module("pytest", "--pyargs", "conformance", "--impl", "accelerate_ref", "--conformance-worlds", "1,2",
                      "-k", "is_main", "-q", "-p", "no:cacheprovider", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout, proc.stdout
