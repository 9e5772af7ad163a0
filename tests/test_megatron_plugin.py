"""`MegatronLMPlugin` takes every field HF 1.15 documents, with the same environment defaults.

Catalog: plugin.unavailable_engines (validated as a dataclass; the engine itself is refused).
"""

from __future__ import annotations

import dataclasses

import pytest

from accelerate_ref.utils import MegatronLMPlugin
from accelerate_ref.utils._dataclasses.megatron import ENV_DEFAULTS

hf_utils = pytest.importorskip("accelerate.utils")

#: Launcher-style settings, one of each parsed kind (int, flag, float, string).
ENVIRONMENT = {
    "MEGATRON_LM_TP_DEGREE": "2",
    "MEGATRON_LM_USE_DISTRIBUTED_OPTIMIZER": "true",
    "MEGATRON_LM_ATTENTION_BACKEND": "0",
    "MEGATRON_LM_HIDDEN_DROPOUT": "0.25",
    "MEGATRON_LM_RECOMPUTE_METHOD": "block",
    "MEGATRON_LM_DECODER_LAST_PIPELINE_NUM_LAYERS": "3",
}


def _fields(plugin: object) -> dict:
    return {f.name: getattr(plugin, f.name) for f in dataclasses.fields(plugin)}


def test_the_fields_are_hf_fields():
    assert [f.name for f in dataclasses.fields(MegatronLMPlugin)] == [
        f.name for f in dataclasses.fields(hf_utils.MegatronLMPlugin)
    ]


@pytest.mark.parametrize("environment", [{}, ENVIRONMENT], ids=["defaults", "from-environment"])
def test_unset_fields_take_hf_defaults_and_environment(monkeypatch, environment):
    for name in ENV_DEFAULTS:
        monkeypatch.delenv(f"MEGATRON_LM_{name.upper()}", raising=False)
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    ours, theirs = _fields(MegatronLMPlugin()), _fields(hf_utils.MegatronLMPlugin())
    assert ours == theirs, {k: (ours[k], theirs[k]) for k in ours if ours[k] != theirs.get(k)}


def test_given_fields_win_and_consumed_samples_cover_three_splits():
    kwargs = {"tp_degree": 4, "sequence_parallelism": True, "consumed_samples": [8], "lr_decay_style": "cosine"}
    ours, theirs = MegatronLMPlugin(**kwargs), hf_utils.MegatronLMPlugin(**dict(kwargs, consumed_samples=[8]))
    assert _fields(ours) == _fields(theirs)
    assert ours.consumed_samples == [8, 0, 0]
