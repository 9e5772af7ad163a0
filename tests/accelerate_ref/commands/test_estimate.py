"""``estimate-memory`` (``commands.estimate``) beside 🤗 Accelerate 1.15's on the same local model folders.

HF's command sends every name to the Hub; here its ``verify_on_hub`` is replaced by the local
metadata accelerate_ref reads (``local_model_info``: the folder's config.json and model card), so
both build the same empty model from the same config offline, flag by flag, and must print the same
table or raise the same exception type with the same text. Hub names that fail before any request
(a path that is no repo ID) or whose request fails are compared unpatched. Catalog: modeling.sizes.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from unittest import mock

import pytest

hf_estimate = pytest.importorskip("accelerate.commands.estimate")
transformers = pytest.importorskip("transformers")

from accelerate_ref.commands import estimate as ref_estimate  # noqa: E402
from accelerate_ref.commands.accelerate_cli import run  # noqa: E402

CUSTOM_CONFIG = '''from transformers import PretrainedConfig


class TinyConfig(PretrainedConfig):
    model_type = "tiny-custom"

    def __init__(self, hidden=16, **kwargs):
        self.hidden = hidden
        super().__init__(**kwargs)
'''

CUSTOM_MODEL = '''import torch
from transformers import PreTrainedModel

from .configuration_tiny import TinyConfig


class TinyModel(PreTrainedModel):
    config_class = TinyConfig

    def __init__(self, config):
        super().__init__(config)
        self.inner = torch.nn.Linear(config.hidden, config.hidden)
        self.outer = torch.nn.Linear(config.hidden, 4 * config.hidden)
'''


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Local model folders: tiny GPT-2 and BERT configs, a remote-code model, and broken ones."""
    root = tmp_path_factory.mktemp("models")
    transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000, n_positions=128).save_pretrained(root / "gpt2")
    transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128,
                            vocab_size=1000).save_pretrained(root / "bert")
    (root / "custom").mkdir()
    (root / "custom" / "configuration_tiny.py").write_text(CUSTOM_CONFIG)
    (root / "custom" / "modeling_tiny.py").write_text(CUSTOM_MODEL)
    (root / "custom" / "config.json").write_text(
        '{"model_type": "tiny-custom", "hidden": 16, '
        '"auto_map": {"AutoConfig": "configuration_tiny.TinyConfig", "AutoModel": "modeling_tiny.TinyModel"}}')
    (root / "empty").mkdir()
    (root / "no_model_type").mkdir()
    (root / "no_model_type" / "config.json").write_text('{"hidden": 16}')
    (root / "diffusers").mkdir()
    (root / "diffusers" / "README.md").write_text("---\nlibrary_name: diffusers\n---\n# a pipeline\n")
    return root


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))  # where remote code is copied


def _outcome(module, argv: list[str]):
    """What ``module.estimate_command`` does with ``argv``: ``("printed", stdout)`` or ``("raised", type, text)``."""
    args = module.estimate_command_parser().parse_args(argv)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            module.estimate_command(args)
    except Exception as error:  # noqa: BLE001 - the exception is the observation
        return ("raised", type(error), str(error))
    return ("printed", printed.getvalue())


def _hf_outcome(argv: list[str]):
    local = lambda repo, token=None: ref_estimate.local_model_info(repo) or "gated"  # noqa: E731
    with mock.patch.object(hf_estimate, "verify_on_hub", local):
        return _outcome(hf_estimate, argv)


@pytest.mark.parametrize("flags", [[], ["--dtypes", "float16", "int4"], ["--library_name", "transformers"],
                                   ["--trust_remote_code", "--dtypes", "int8"]])
@pytest.mark.parametrize("model", ["gpt2", "bert", "gpt2/config.json"])
def test_the_table_is_hfs(models, model, flags):
    path = str(models / model)
    ours = _outcome(ref_estimate, [path, *flags])
    assert ours[0] == "printed" and "Memory Usage for loading" in ours[1]
    assert ours == _hf_outcome([path, *flags])


def test_remote_code_needs_the_flag_as_in_hf(models):
    path = str(models / "custom")
    refused = _outcome(ref_estimate, [path])
    assert refused[:2] == ("raised", ValueError) and "trust_remote_code=True" in refused[2]
    assert refused == _hf_outcome([path])
    trusted = _outcome(ref_estimate, [path, "--trust_remote_code"])
    assert trusted[0] == "printed" and "2.12 KB" in trusted[1]  # inner 16x16+16 and outer 16x64+64 float32 weights
    assert trusted == _hf_outcome([path, "--trust_remote_code"])


@pytest.mark.parametrize("model, flags, error", [
    ("empty", [], ValueError),  # no config, no card: no library metadata
    ("empty", ["--library_name", "transformers"], RuntimeError),  # no config for transformers
    ("no_model_type", [], RuntimeError),  # transformers' "Unrecognized model": no model found
    ("diffusers", [], ValueError),  # the card names a library the command does not support
    ("gpt2", ["--library_name", "timm"], ImportError),  # timm is not installed here
])
def test_refusals_are_hfs(models, model, flags, error):
    if error is ImportError and ref_estimate.is_timm_available():
        pytest.skip("timm is installed")
    ours = _outcome(ref_estimate, [str(models / model), *flags])
    assert ours[:2] == ("raised", error)
    assert ours == _hf_outcome([str(models / model), *flags])


def _repository_not_found(message: str) -> Exception:
    """huggingface_hub's RepositoryNotFoundError, as the Hub's 404 raises it: huggingface_hub 1 and later (which
    Transformers 5 brings) require the HTTP response, from the HTTP library that version uses; 0.x takes none."""
    from huggingface_hub import errors

    try:
        return errors.RepositoryNotFoundError(message)
    except TypeError:
        http = sys.modules[errors.Response.__module__.partition(".")[0]]
        return errors.RepositoryNotFoundError(message, response=errors.Response(404, request=http.Request("GET", "https://huggingface.co/api/models/org/model")))


def test_hub_names_fail_as_in_hf(tmp_path):
    # a path that is no repo ID fails in huggingface_hub's validation, before any request
    absent = str(tmp_path / "absent")
    ours = _outcome(ref_estimate, [absent])
    assert ours[0] == "raised" and issubclass(ours[1], ValueError) and ours == _outcome(hf_estimate, [absent])
    # an unreadable repository (offline, gated) and a missing one, the Hub's answers stood in for: both are
    # "gated" in HF 1.15 (RepositoryNotFoundError is an OSError, caught first), and so in accelerate_ref
    for answer in (OSError("offline"), _repository_not_found("no repo")):
        with mock.patch("huggingface_hub.model_info", side_effect=answer), \
                mock.patch.object(hf_estimate, "model_info", side_effect=answer):
            ours, theirs = _outcome(ref_estimate, ["org/model"]), _outcome(hf_estimate, ["org/model"])
        assert ours[:2] == ("raised", OSError) and "is gated" in ours[2] and ours == theirs


def test_the_command_line_prints_the_table_and_refuses_in_one_line(models, capsys):
    path = str(models / "gpt2")
    assert run(["estimate-memory", path, "--dtypes", "float32"]) == 0
    assert capsys.readouterr().out == _hf_outcome([path, "--dtypes", "float32"])[1]
    with pytest.raises(SystemExit) as exit_info:
        run(["estimate-memory", path, "--dtypes", "float64"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == ("accelerate-ref estimate-memory: error: argument --dtypes: invalid choice: 'float64' "
                                       "(choose from 'float32', 'float16', 'int8', 'int4')\n")
    assert run(["estimate-memory", str(models / "empty")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "does not have any library metadata" in error


@pytest.mark.parametrize("argv", [["m", "--dtypes", "float64"], ["m", "--library_name", "diffusers"], []])
def test_the_parser_refuses_what_hfs_refuses(argv, capsys):
    messages = []
    for module in (ref_estimate, hf_estimate):
        with pytest.raises(SystemExit):
            module.estimate_command_parser().parse_args(argv)
        messages.append(capsys.readouterr().err.splitlines()[-1].split("error: ")[1])
    assert messages[0] == messages[1]


@pytest.mark.parametrize("title_length", range(40, 62))
def test_the_ascii_table_is_hfs_for_every_title_length(title_length):
    headers = ["dtype", "Largest Layer", "Total Size", "Training using Adam"]  # 49 columns wide, 54 framed
    rows = [["float32", "250.0 KB", "677.01 KB", "2.64 MB"], ["int4", "31.25 KB", "84.63 KB", "N/A"]]
    title = ("T" * title_length)
    assert ref_estimate.create_ascii_table(headers, rows, title) == hf_estimate.create_ascii_table(headers, rows, title)


@pytest.mark.parametrize("precision", ["float32", "float16", "bfloat16", "fp8", "int8", "no"])
def test_training_usage_is_hfs(precision):
    for msamp in (None, "O1"):
        assert (ref_estimate.estimate_training_usage(1001, precision, msamp)
                == hf_estimate.estimate_training_usage(1001, precision, msamp))


def test_gather_data_rows_and_helpers_are_hfs(models):
    args = argparse.Namespace(model_name=str(models / "bert"), library_name=None, trust_remote_code=False,
                              dtypes=["float32", "int8", "bfloat16"])
    ours = ref_estimate.gather_data(args)
    with mock.patch.object(hf_estimate, "verify_on_hub", lambda repo, token=None: ref_estimate.local_model_info(repo)):
        theirs = hf_estimate.gather_data(args)
    assert ours == theirs and [type(value) for value in ours[0]] == [type(value) for value in theirs[0]]
    for name in ("org/model", "resnet50", "hf-hub:org/model", "local-dir:/x"):
        assert ref_estimate.add_timm_hub_prefix(name) == hf_estimate.add_timm_hub_prefix(name)
    for error in (OSError("x does not appear to have a file named config.json"), ValueError("Unrecognized model in x"),
                  KeyError("architecture"), RuntimeError("Unknown model")):
        assert ref_estimate.check_has_model(error) == hf_estimate.check_has_model(error)
