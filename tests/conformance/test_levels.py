"""Conformance levels (``conformance/engine/levels.py``): each case rests on docs-0.27, docs-1.x or hf-1.15; a run
at a level runs the cases up to it, counts the rest apart, names its level in every report, and spells the API as
its level does."""

from __future__ import annotations

import io
import json
import sys
import xml.etree.ElementTree as ET

import pytest

from simulators.fork_root import run_module
from conformance import catalog
from conformance.engine import levels, report, statement
from conformance.engine.case import all_cases
from conformance.engine.results import CaseResult, Status
from conformance.engine.runner import Run, RunOptions, execute

#: A docs-1.x row (profile() and ProfileKwargs are the v1.x reference's) and a docs-0.27 row with a v0.27 spelling.
PATTERNS = ["profile.context", "data.split_batches"]


def test_every_case_has_a_level_and_the_level_table_names_only_rows_and_cases_that_exist():
    cases = all_cases()
    assert {case.level for case in cases} == set(levels.LEVELS)
    table = levels._table()
    rows = {row for ids in table["rows"].values() for row in ids}
    assert rows <= set(catalog.by_id()), rows - set(catalog.by_id())
    assert set(table["cases"]) <= {case.key for case in cases}, set(table["cases"]) - {case.key for case in cases}
    assert {case.level for case in cases if case.id == "profile.context"} == {"docs-1.x"}


def test_a_level_runs_the_cases_up_to_it_and_counts_the_rest_apart_in_every_report(tmp_path):
    out = io.StringIO()
    run = execute(RunOptions(impl="accelerate_ref", worlds=["1"], patterns=PATTERNS, level="docs-0.27"), out=out)
    assert [(result.id, result.status) for result in run.results] == [("data.split_batches", Status.PASS)], out.getvalue()
    assert run.metadata["level"] == "docs-0.27"
    assert run.metadata["beyond_level"] == ["conformance.cases.test_memory_and_seeds:profile_context"]
    assert "level: docs-0.27 (1 cases beyond it, not run)" in out.getvalue()
    assert "1 pass, 1 beyond level docs-0.27" in out.getvalue(), out.getvalue()[-500:]
    report.write_json(run, tmp_path / "run.json")
    assert json.loads((tmp_path / "run.json").read_text())["metadata"]["level"] == "docs-0.27"
    report.write_junit(run, tmp_path / "run.xml")
    suite = ET.parse(tmp_path / "run.xml").getroot()
    assert suite.get("name") == "conformance[accelerate_ref@sim,docs-0.27]"
    assert {p.get("name"): p.get("value") for p in suite.iter("property")} == {"level": "docs-0.27", "beyond_level": "1"}
    columns, cells = report.matrix([run])
    assert columns[0][1] == "sim, docs-0.27"
    assert cells["profile.context"][columns[0]] == "beyond level" and cells["data.split_batches"][columns[0]] == "PASS"
    line = statement.write([run], tmp_path / "statement.md")
    assert line == f"accelerate_ref {run.metadata['impl_version']} conforms to docs-0.27: 1/1 passed, 0 deviations (sim)"
    published = json.loads((tmp_path / "statement.json").read_text())
    assert (published["level"], published["passed"], published["run"], published["beyond_level"]) == ("docs-0.27", 1, 1, 1)
    assert line in (tmp_path / "statement.md").read_text()


def test_a_statement_lists_each_deviation_with_its_reason_and_refuses_runs_of_two_levels():
    def result(status, reason=""):
        return CaseResult("reduce.none", "reduce_none", status, "2", "sim", "accelerate", 0.1, manifest_reason=reason)

    meta = {"impl": "accelerate", "impl_version": "1.15.0", "backend": "sim", "worlds": ["1", "2"], "level": "hf-1.15",
            "beyond_level": [], "manifest": "accelerate.toml", "started": "2026-11-29T12:00:00+00:00"}
    run = Run(meta, [result(Status.PASS), result(Status.XFAIL, "sums instead (upstream)")])
    built = statement.build([run])
    assert (built["passed"], built["run"]) == (1, 2)
    assert built["deviations"] == [{"id": "reduce.none", "reason": "sums instead (upstream)", "where": ["sim 2"]}]
    assert "| `reduce.none` | sums instead (upstream) | sim 2 |" in statement.markdown(built)
    with pytest.raises(statement.StatementError, match="runs differ in level"):
        statement.build([run, Run({**meta, "level": "docs-0.27"}, [])])


@pytest.mark.skipif(sys.modules.get("accelerate") is None and __import__("importlib").util.find_spec("accelerate") is None,
                    reason="HF accelerate (extra hf) is not installed")
def test_a_case_spells_the_api_as_its_level_does():
    """HF 1.15 still takes v0.27's ``Accelerator(split_batches=True)`` but ignores it (``split_batches`` stays
    False): at docs-0.27 the case reaches it with that keyword and fails at world 2; at hf-1.15 it goes through
    ``DataLoaderConfiguration`` and passes."""
    runs = {level: execute(RunOptions(impl="accelerate", worlds=["2"], patterns=["data.split_batches"], level=level),
                           out=io.StringIO()) for level in ("docs-0.27", "hf-1.15")}
    (old,), (new,) = runs["docs-0.27"].results, runs["hf-1.15"].results
    assert old.status == Status.FAIL, old.message
    assert new.status == Status.PASS, new.message


def test_an_unknown_level_is_one_line_and_exit_2():
    done = run_module("conformance", "run", "-k", "nothing", timeout=120,
                      env={**__import__("os").environ, levels.LEVEL_ENV: "docs-2"})
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "conformance: error: --level: unknown conformance level 'docs-2': choose one of docs-0.27, docs-1.x, hf-1.15"]
