"""``conformance.tools.level_check`` and ``documented_names``: every suite case reaches only names its level's
documents list, and a case tagged below the API it uses is caught."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.engine.case import all_cases
from conformance.tools import documented_names
from conformance.tools.level_check import lowest_level, reached_names, undocumented
from tests.conformance.fixture_cases import levels as fixtures

SEEDS = Path(__file__).resolve().parents[4] / "shared" / "seeds"


def test_every_suite_case_reaches_only_names_its_levels_documents_list():
    wrong = {case.key: (case.level, sorted(undocumented(case))) for case in all_cases() if undocumented(case)}
    assert not wrong, f"cases reaching names their level's documents do not list (retag them or spell by level): {wrong}"


def test_a_case_tagged_docs_027_but_written_with_the_v1x_api_fails_the_check():
    assert undocumented(fixtures.tagged_v027_written_with_v1x) == {"DataLoaderConfiguration", "dataloader_config",
                                                                    "use_gather_object"}
    assert undocumented(fixtures.tagged_v1x_written_with_v1x) == set(), "tagged docs-1.x, the same names are documented"
    assert lowest_level(fixtures.tagged_v027_written_with_v1x) == "docs-1.x"


def test_the_check_follows_the_helpers_of_the_cases_own_module():
    assert "ProfileKwargs" in reached_names(fixtures.tagged_v027_through_a_helper)
    assert undocumented(fixtures.tagged_v027_through_a_helper) == {"ProfileKwargs", "output_trace_dir"}


def test_the_names_of_v027_keywords_are_documented_at_docs_027_and_the_v1x_ones_only_above():
    names = documented_names.bundled()
    assert {"split_batches", "dispatch_batches", "even_batches", "gather_for_metrics"} <= names["docs-0.27"]
    assert "DataLoaderConfiguration" not in names["docs-0.27"] and "DataLoaderConfiguration" in names["docs-1.x"]
    assert names["docs-0.27"] <= names["docs-1.x"]


@pytest.mark.skipif(not SEEDS.is_dir(), reason="shared/seeds not beside the checkout")
def test_the_shipped_names_are_those_of_the_seed_documents():
    shipped = {level: sorted(names) for level, names in documented_names.bundled().items()}
    assert shipped == documented_names.extract(SEEDS), "run python -m conformance.tools.documented_names ../shared/seeds"
