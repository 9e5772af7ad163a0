"""Mutation testing's driver (issue 24), without running the suite: the map and the equivalents file are read and
checked, the draw repeats, the report's arithmetic holds on a made-up session, and sources come back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance.__main__ import main
from conformance.tools.mutation import plan
from conformance.tools.mutation.cli import checkout_problem
from conformance.tools.mutation.report import Counts, ModuleRun, Result, markdown, table, to_json, totals

HOOKS = "accelerate_ref/hooks.py"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _map(tmp_path: Path, body: str) -> Path:
    return _write(tmp_path, "mutation.toml", '[module."accelerate_ref.hooks"]\n' + body)


GOOD = f'paths = ["{HOOKS}"]\nworlds = "1"\npatterns = ["hooks.*"]\n'


def test_the_bundled_map_covers_the_six_modules_with_slices_that_select_cases() -> None:
    slices = plan.load_map()
    assert [s.module.removeprefix("accelerate_ref.") for s in slices] == [
        "utils.operations", "data_loader", "accelerator", "big_modeling", "hooks", "utils.modeling"]
    assert all(s.probes == (s.module.removeprefix("accelerate_ref.") + ".*",) for s in slices), "each module's own probes"
    operations = plan.select(slices, ["operations"])[0]
    assert operations.command("python")[:2] == ["sh", "-c"]
    assert operations.command("python")[2].startswith("python -m conformance run --impl accelerate_ref --backend sim --worlds 1,2 ")
    hooks = plan.select(slices, ["hooks"])[0]
    run = "python -m conformance run --impl accelerate_ref --backend {} --worlds 1 -k 'bigmodel.*' -k 'hooks.*'"
    probes = "python -m conformance differential --impl accelerate_ref --settings cpu/1,cuda/1 -k 'hooks.*'"
    assert hooks.command("python") == ["sh", "-c", f"{run.format('sim')} && {run.format('sim-npu')} && {probes}"]
    assert "--settings cpu/1,cpu/2,cpu/3 " in operations.command("python")[2], "the default settings of the probes"
    tests = operations.command("python")[2].rsplit(" && ", 1)[1]
    assert tests.startswith("python -m pytest -q -x -p no:cacheprovider tests/accelerate_ref/utils/test_operations.py::"), tests
    assert plan.load_equivalents() == plan.load_equivalents(plan.EQUIVALENTS)


def test_a_map_is_read_and_checked(tmp_path: Path) -> None:
    assert plan.load_map(_map(tmp_path, GOOD)) == [plan.Slice("accelerate_ref.hooks", (HOOKS,), "1", ("hooks.*",))]


@pytest.mark.parametrize("body, message", [
    (GOOD.replace("hooks.py", "nohooks.py"), "no file accelerate_ref/nohooks.py"),
    (GOOD.replace('"1"', '"0"'), "worlds:"),
    (GOOD.replace('"1"', "1"), "worlds must be a string"),
    (GOOD.replace('"hooks.*"', '"nothing.*"'), "pattern 'nothing.*' matches no catalog ID"),
    (GOOD.replace('["hooks.*"]', "[]"), "patterns must be a non-empty list of strings"),
    (GOOD + 'backend = "sim"\n', "unknown key 'backend'"),
    (GOOD + 'backends = ["native"]\n', "backend 'native' is not one of sim, sim-xla, sim-npu"),
    (GOOD + 'probes = ["nothing.*"]\n', "probe pattern 'nothing.*' matches no differential probe"),
    (GOOD + 'tests = ["tests/nothing.py::test_x"]\n', "test 'tests/nothing.py::test_x' names no file"),
    (GOOD + 'settings = ["cpu/9"]\n', "setting 'cpu/9' is not one of cpu/1, cpu/2, cpu/3, cuda/1, cuda/2"),
])
def test_a_bad_map_is_one_clear_error(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(plan.PlanError, match=message.replace("*", r"\*").replace("(", r"\(")):
        plan.load_map(_map(tmp_path, body))


def test_modules_are_chosen_by_full_or_last_name(tmp_path: Path) -> None:
    slices = plan.load_map()
    assert [s.module for s in plan.select(slices, ["accelerate_ref.hooks", "data_loader"])] == [
        "accelerate_ref.data_loader", "accelerate_ref.hooks"]
    with pytest.raises(plan.PlanError, match="unknown module 'nope'; choose from accelerate_ref.utils.operations"):
        plan.select(slices, ["nope"])


ENTRY = f'[[equivalent]]\npath = "{HOOKS}"\noperator = "core/NumberReplacer"\noccurrence = 2\nsource = "x = 0"\nreason = "r"\n'
MUTANTS = [plan.Mutant(HOOKS, "core/NumberReplacer", n, 10 + n, "x = 0") for n in range(4)]


def test_equivalents_are_read_and_matched_to_their_mutant(tmp_path: Path) -> None:
    entries = plan.load_equivalents(_write(tmp_path, "eq.toml", ENTRY))
    assert entries == [plan.Equivalent(HOOKS, "core/NumberReplacer", 2, "x = 0", "r")]
    assert list(plan.match_equivalents(MUTANTS, entries, [HOOKS])) == [(HOOKS, "core/NumberReplacer", 2)]
    assert plan.match_equivalents([], entries, ["accelerate_ref/other.py"]) == {}


@pytest.mark.parametrize("text, message", [
    (ENTRY.replace('reason = "r"', 'reason = ""'), "entry 1: reason missing"),
    (ENTRY.replace("occurrence = 2", 'occurrence = "2"'), "entry 1: occurrence missing or not a int"),
    (ENTRY + 'note = "n"\n', "entry 1: unknown key 'note'"),
    (ENTRY + ENTRY, "entry 2: accelerate_ref/hooks.py core/NumberReplacer #2 listed twice"),
    ("equivalent = 1\n", "array of tables"),
    ("[[equivalent\n", "eq.toml"),
])
def test_a_bad_equivalents_file_is_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(plan.PlanError, match=message.replace("[", r"\[").replace("#", r"\#")):
        plan.load_equivalents(_write(tmp_path, "eq.toml", text))


@pytest.mark.parametrize("edit", [{"source": "y = 1"}, {"occurrence": 9}])
def test_an_equivalent_whose_mutant_moved_is_stale(edit: dict) -> None:
    fields = {"path": HOOKS, "operator": "core/NumberReplacer", "occurrence": 2, "source": "x = 0", "reason": "r"}
    with pytest.raises(plan.PlanError, match="stale equivalent"):
        plan.match_equivalents(MUTANTS, [plan.Equivalent(**{**fields, **edit})], [HOOKS])


def test_the_draw_repeats_for_a_seed_whatever_the_order_of_the_mutants() -> None:
    many = [plan.Mutant("m.py", f"core/Op{n % 7}", n, n, "") for n in range(200)]
    first = plan.draw(many, 20, 3, "accelerate_ref.hooks")
    assert first == plan.draw(list(reversed(many)), 20, 3, "accelerate_ref.hooks")
    assert len(set(first)) == 20 and set(first) <= set(many)
    assert first != plan.draw(many, 20, 4, "accelerate_ref.hooks")
    assert first != plan.draw(many, 20, 3, "accelerate_ref.data_loader")
    assert sorted(plan.draw(many[:5], 20, 3, "m"), key=lambda m: m.key) == many[:5]


def _fake_run() -> ModuleRun:
    piece = plan.Slice("accelerate_ref.hooks", (HOOKS,), "1", ("hooks.*",))
    mutants = [plan.Mutant(HOOKS, "core/NumberReplacer", n, 10 + n, f"x = {n}") for n in range(10)]
    equivalent = plan.Equivalent(HOOKS, "core/NumberReplacer", 9, "x = 9", "r")
    outcomes = ["killed", "killed", "killed", "timeout", "survived", "incompetent"]
    results = [Result(m, o, 2.0 + n, f"--- mutation diff ---\n-x = {n}\n+x = {n + 1}")
               for n, (m, o) in enumerate(zip(mutants, outcomes))]
    return ModuleRun(piece, mutants, {equivalent.key: equivalent}, mutants[:8], 4.0, results)


def test_the_counts_and_the_kill_rate_of_a_session() -> None:
    counts = Counts.of(_fake_run())
    assert (counts.total, counts.sampled, counts.killed, counts.survived, counts.timeout, counts.incompetent,
            counts.equivalent, counts.not_run) == (10, 8, 3, 1, 1, 1, 1, 2)
    assert counts.kill_rate == 0.8  # (3 killed + 1 timed out) / (those 4 + 1 survived)
    assert counts.seconds_per_mutant == 4.5  # 2, 3, ..., 7 s
    empty = Counts.of(ModuleRun(_fake_run().slice, [], {}, [], 1.0))
    assert (empty.kill_rate, empty.seconds_per_mutant) == (None, None)


def test_the_reports_show_the_table_totals_and_each_survivor_with_its_diff() -> None:
    runs = [_fake_run(), _fake_run()]
    assert totals(runs)["killed"] == 6 and totals(runs)["kill_rate"] == 0.8
    assert "| accelerate_ref.hooks | 10 | 8 | 3 | 1 | 1 | 1 | 1 | 2 | 80% | 4.5 |" in table(runs)
    assert "| **all** | 20 | 16 | 6 | 2 | 2 | 2 | 2 | 4 | 80% | 4.5 |" in table(runs)
    meta = {"seed": 0, "sample": 8, "budget_s": 60, "duration_s": 50}
    text = markdown(runs, meta)
    assert "## Surviving mutants (2)" in text and f"### {HOOKS}:14 core/NumberReplacer #4" in text
    assert "-x = 4\n+x = 5" in text and "mutation diff" not in text
    data = json.loads(json.dumps(to_json(runs, meta)))
    module = data["modules"][0]
    assert module["kill_rate"] == 0.8 and len(module["results"]) == 6 and len(module["not_run_mutants"]) == 2
    assert [r.get("diff") is not None for r in module["results"]] == [False] * 4 + [True, False]


def test_the_checkout_mutated_must_be_the_one_imported(tmp_path: Path) -> None:
    assert checkout_problem() is None
    assert "put the checkout first on PYTHONPATH" in checkout_problem(tmp_path)


def test_bad_options_are_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mutation", "--sample", "0"]) == 2
    assert main(["mutation", "--module", "nope"]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert errors[0] == "conformance mutation: --sample and --budget must be positive"
    assert errors[1].startswith("conformance mutation: unknown module 'nope'")


def test_sources_come_back_however_the_run_ends(tmp_path: Path) -> None:
    session = pytest.importorskip("conformance.tools.mutation.session")
    (tmp_path / "pkg").mkdir()
    source = _write(tmp_path, "pkg/mod.py", "x = 1\n")
    backups = tmp_path / "pristine"
    with pytest.raises(KeyboardInterrupt):
        with session.pristine(tmp_path, ["pkg/mod.py"], backups):
            source.write_text("x = 2\n")
            raise KeyboardInterrupt
    assert source.read_text() == "x = 1\n" and not backups.exists()
    with session.pristine(tmp_path, ["pkg/mod.py"], backups):
        source.write_text("x = 3\n")
        kept = tmp_path / "kept"
        backups.rename(kept)  # as a killed run leaves them
    assert session.recover(tmp_path, kept) == ["pkg/mod.py"] and source.read_text() == "x = 1\n"
    assert session.recover(tmp_path, kept) == []


ANNOTATED = '''from __future__ import annotations


def pad(tensor: int | None, dim: int = 0) -> list[int] | None:
    size: int | None = dim | 1
    return None
'''


def _at(line: int, start: int, end: int) -> plan.Mutant:
    return plan.Mutant("m.py", "core/ReplaceBinaryOperator_BitOr_BitXor", start, line, "", ((line, start), (line, end)))


def test_mutants_inside_postponed_annotations_are_equivalent_and_others_are_not() -> None:
    line = ANNOTATED.splitlines()[3]
    argument, default = _at(4, line.index("int | None"), line.index("int | None") + 10), _at(4, line.index("0)"), line.index("0)") + 1)
    returned = _at(4, line.index("list[int] | None"), line.index("list[int] | None") + 16)
    assigned = ANNOTATED.splitlines()[4]
    annotated, value = _at(5, assigned.index("int"), assigned.index("int") + 10), _at(5, assigned.index("dim |"), assigned.index("dim |") + 7)
    found = plan.annotation_equivalents([argument, default, returned, annotated, value], {"m.py": ANNOTATED})
    assert set(found) == {argument.key, returned.key, annotated.key}
    assert all(entry.reason == plan.ANNOTATION_REASON for entry in found.values())
    evaluated = ANNOTATED.replace("from __future__ import annotations", "")  # the same lines, evaluated at import
    assert plan.annotation_equivalents([argument], {"m.py": evaluated}) == {}, "annotations evaluated at import are code"
