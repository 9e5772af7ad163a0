"""The releases the documents describe, each held to its own level with its own manifest.

The rule: HF accelerate 0.27.2 (the v0.27 documents) runs at level docs-0.27 and accelerate 1.0.1 (the v1.x
Accelerator reference) at docs-1.x; each run picks ``conformance/manifests/accelerate-<version>.toml`` by the
installed version, and with ``--strict`` every result is PASS, XFAIL or NOT_SUPPORTED: each deviation is listed
with its reason and still happens. `make` installs the releases beside the venv
(``<venv>/releases/accelerate-<version>``, put first on PYTHONPATH); a release not installed there is skipped.
Any other version (HF 1.15) gets the plain ``accelerate.toml``.

``make test`` runs each release at world 2 without the "Launching" section (the release's own command line
started a dozen times, as in HF 1.15's fast run in test_full.py); ``make extended`` runs each whole at worlds 1, 2
and 2x2.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from conformance.engine.manifest import Manifest
from simulators.fork_root import run_module

from .test_full import FAST_SKIPPED_AREAS, case_ids

ROOT = Path(__file__).resolve().parents[2]
RELEASES = Path(sys.prefix) / "releases"
#: Each release and the level of the documents it implements.
LEVELS = {"0.27.2": "docs-0.27", "1.0.1": "docs-1.x"}
PROBLEMS = {"FAIL", "ERROR", "HANG", "CRASH"}


@pytest.mark.parametrize("version", sorted(LEVELS))
def test_the_bundled_manifest_of_a_release_is_its_versioned_file(version):
    assert Manifest.bundled("accelerate", version).source == f"conformance/manifests/accelerate-{version}.toml"


def test_other_versions_get_the_plain_manifest():
    assert Manifest.bundled("accelerate", "1.15.0").source == "conformance/manifests/accelerate.toml"


@pytest.mark.slow
@pytest.mark.longest
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("version", sorted(LEVELS))
@pytest.mark.parametrize("worlds", ["2", pytest.param("1,2,2x2", marks=pytest.mark.extended)])
def test_a_release_conforms_to_its_level_but_for_its_manifest(version, worlds, tmp_path):
    release = RELEASES / f"accelerate-{version}"
    if not (release / "accelerate").is_dir():
        pytest.skip(f"accelerate {version} is not installed at {release} (make installs it beside the venv)")
    report = tmp_path / "run.json"
    env = {**os.environ, "PYTHONPATH": str(release)}
    whole = worlds != "2"
    patterns = [] if whole else [pattern for id_ in case_ids(FAST_SKIPPED_AREAS, inside=False) for pattern in ("-k", id_)]
    done = run_module("conformance", "run", "--impl", "accelerate", "--level", LEVELS[version], "--worlds", worlds,
                      "--strict", "--json", str(report), *patterns, cwd=ROOT, env=env, timeout=1700)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    run = json.loads(report.read_text())
    meta = run["metadata"]
    assert (meta["impl_version"], meta["level"]) == (version, LEVELS[version])
    assert meta["manifest"] == f"conformance/manifests/accelerate-{version}.toml"
    problems = [f"{r['status']} {r['id']}[{r['case']}]: {r['message'][:300]}" for r in run["results"] if r["status"] in PROBLEMS]
    assert problems == []
