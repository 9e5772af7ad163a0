"""``commands.utils.CustomArgumentParser`` beside 🤗 Accelerate 1.15's: which options take both spellings, their
defaults, and the ``nondefault`` record of the flags given. Catalog: launch.cli.
"""

from __future__ import annotations

import pytest

from accelerate_ref.commands import utils as ref_utils

hf_utils = pytest.importorskip("accelerate.commands.utils")


def _build(module):
    parser = module.CustomArgumentParser(allow_abbrev=False)
    parser.add_argument("--plain_store", type=int)
    parser.add_argument("--top_flag", action="store_true")
    parser.add_argument("--top_false", action="store_false")
    parser.add_argument("--top_append", action="append")
    group = parser.add_argument_group("group")
    group.add_argument("--group_flag", action="store_true")
    group.add_argument("--group_false", action="store_false")
    group.add_argument("--group_const", action="store_const", const=3)
    group.add_argument("--group_store", default="x")
    group.add_argument("--group_append", action="append")
    return parser


def _options(parser) -> dict:
    return {action.dest: (sorted(action.option_strings), action.default) for action in parser._actions}


def test_spellings_and_defaults_are_hfs():
    assert _options(_build(ref_utils)) == _options(_build(hf_utils))
    assert _build(ref_utils).parse_args([]).top_flag is None


@pytest.mark.parametrize("argv", [[], ["--plain-store", "2", "--group-flag", "--group-const", "--top_flag"],
                                  ["--group-false", "--group-store", "y", "--top_false"]])
def test_parsed_values_and_the_given_flags_are_hfs(argv):
    assert vars(_build(ref_utils).parse_args(argv)) == vars(_build(hf_utils).parse_args(argv))


def test_a_spelling_given_twice_is_listed_once():
    parser = ref_utils.CustomArgumentParser()
    parser.add_argument("--config_file", "--config-file")
    assert parser._actions[-1].option_strings == ["--config_file", "--config-file"]
