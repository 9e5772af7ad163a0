"""API parity with HF accelerate 1.15 (issue 13): every public name present and compatible, or listed.

The checker itself is proved on small fixtures: a missing name, a changed default and a
stale exclusion are each reported, and bad input is one line with exit status 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("accelerate")

from simulators.fork_root import run_module
from conformance.tools import parity  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
EXCLUSIONS = ROOT / "accelerate_ref" / "PARITY.toml"


@pytest.fixture(scope="module")
def report() -> parity.ParityReport:
    return parity.check("accelerate_ref", parity.Exclusions.load(EXCLUSIONS))


def test_every_gap_is_listed_with_a_reason(report: parity.ParityReport) -> None:
    unexplained = [f"{f.status} {f.key} {f.detail}" for f in report.unexplained]
    assert not unexplained, "names missing or incompatible and not in PARITY.toml:\n" + "\n".join(unexplained)


def test_no_exclusion_is_stale(report: parity.ParityReport) -> None:
    assert not report.stale, "listed in PARITY.toml but present and compatible (delete them):\n" + "\n".join(report.stale)


def test_counts_cover_every_documented_module(report: parity.ParityReport) -> None:
    import importlib

    counts = report.counts()
    for module in parity.REFERENCE_MODULES:
        if any(True for _ in parity.public_names(importlib.import_module(module))):
            assert module in counts, module
    assert sum(row["names"] for row in counts.values()) == len(report.findings)


def _write_impl(tmp_path: Path, body: dict[str, str]) -> None:
    package = tmp_path / "parity_fixture_impl"
    for relative, text in body.items():
        path = package / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _forget_fixture_impl() -> None:
    for name in [m for m in sys.modules if m.startswith("parity_fixture_impl")]:
        del sys.modules[name]


def _fixture_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str, exclusions: parity.Exclusions):
    _write_impl(tmp_path, {"__init__.py": "", "utils/__init__.py": "", "utils/versions.py": version})
    monkeypatch.syspath_prepend(str(tmp_path))
    _forget_fixture_impl()
    return parity.check("parity_fixture_impl", exclusions, ["accelerate.utils.versions"])


def test_a_missing_name_and_a_changed_default_are_found(tmp_path, monkeypatch) -> None:
    version = (
        "def compare_versions(library_or_version, operation, requirement_version=1):\n    pass\n"
        "def is_torch_version(operation, version):\n    pass\n"
    )
    result = _fixture_check(tmp_path, monkeypatch, version, parity.Exclusions())
    status = {f.qualname: f.status for f in result.findings}
    assert status["compare_versions"] == parity.DIFFERENT
    assert status["is_torch_version"] == parity.COMPATIBLE
    missing = [q for q, s in status.items() if s == parity.MISSING]
    assert missing, status
    assert {f.qualname for f in result.unexplained} == {"compare_versions", *missing}
    assert not result.ok


def test_an_exclusion_explains_a_gap_and_a_stale_one_is_reported(tmp_path, monkeypatch) -> None:
    full = _fixture_check(tmp_path, monkeypatch, "", parity.Exclusions())
    target = "accelerate.utils.versions:compare_versions"
    others = [f.key for f in full.findings if f.key != target]
    exclusions = parity.Exclusions(excluded={k: "fixture" for k in others}, pending={target: "issue 0"})
    assert _fixture_check(tmp_path, monkeypatch, "", exclusions).ok
    present = "def compare_versions(library_or_version, operation, requirement_version):\n    pass\n"
    assert _fixture_check(tmp_path, monkeypatch, present, exclusions).stale == [target]
    gone = parity.Exclusions(excluded={"accelerate.utils.versions:no_such_name": "fixture", **exclusions.excluded},
                             pending=exclusions.pending)
    assert "accelerate.utils.versions:no_such_name" in _fixture_check(tmp_path, monkeypatch, "", gone).stale


def test_an_exclusion_group_gives_its_reason_to_each_name(tmp_path) -> None:
    path = tmp_path / "PARITY.toml"
    path.write_text(
        '[excluded]\n"accelerate:one" = "its own reason"\n'
        '[excluded."engine not run here"]\nreason = "needs CUDA"\nnames = ["accelerate:two", "accelerate:three"]\n'
    )
    exclusions = parity.Exclusions.load(path)
    assert exclusions.excluded == {
        "accelerate:one": "its own reason", "accelerate:two": "needs CUDA", "accelerate:three": "needs CUDA"
    }


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--impl", "no_such_impl_package"], "does not import"),
        (["--impl", "abc"], "not a package"),
        (["--module", "accelerate.no_such_module"], "does not import"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], says: str) -> None:
    done = run_module("conformance", "parity", *args, timeout=120)
    assert done.returncode == 2, done
    assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_an_impl_module_that_raises_on_import_is_bad_input(tmp_path, monkeypatch) -> None:
    _write_impl(tmp_path, {"__init__.py": "", "utils/__init__.py": "raise RuntimeError('broken on purpose')\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    _forget_fixture_impl()
    with pytest.raises(parity.ParityUsageError, match="does not import"):
        parity.check("parity_fixture_impl", parity.Exclusions(), ["accelerate.utils"])
