"""Catalog: env.patch_environment, env.clear_environment."""

import os

import pytest

from accelerate_ref.utils import (
    clear_environment,
    get_int_from_env,
    parse_flag_from_env,
    patch_environment,
    str_to_bool,
)


@pytest.mark.parametrize("value", ["1", "y", "YES", "true", "On", "t"])
def test_str_to_bool_true(value):
    assert str_to_bool(value) == 1


@pytest.mark.parametrize("value", ["0", "n", "No", "FALSE", "off", "f"])
def test_str_to_bool_false(value):
    assert str_to_bool(value) == 0


def test_str_to_bool_rejects_other_values():
    """HF 1.15's words, with the lower-cased value; surrounding spaces are not stripped."""
    with pytest.raises(ValueError, match="^invalid truth value maybe$"):
        str_to_bool("Maybe")
    with pytest.raises(ValueError, match="^invalid truth value  t $"):
        str_to_bool(" t ")


def test_parse_flag_from_env(monkeypatch):
    monkeypatch.delenv("ACCELERATE_REF_TEST_FLAG", raising=False)
    assert parse_flag_from_env("ACCELERATE_REF_TEST_FLAG") is False
    assert parse_flag_from_env("ACCELERATE_REF_TEST_FLAG", default=True) is True
    monkeypatch.setenv("ACCELERATE_REF_TEST_FLAG", "yes")
    assert parse_flag_from_env("ACCELERATE_REF_TEST_FLAG") is True
    monkeypatch.setenv("ACCELERATE_REF_TEST_FLAG", "0")
    assert parse_flag_from_env("ACCELERATE_REF_TEST_FLAG", default=True) is False
    monkeypatch.setenv("ACCELERATE_REF_TEST_FLAG", "sometimes")
    with pytest.raises(ValueError):
        parse_flag_from_env("ACCELERATE_REF_TEST_FLAG")


def test_get_int_from_env(monkeypatch):
    monkeypatch.setenv("ACCELERATE_REF_A", "-1")
    monkeypatch.setenv("ACCELERATE_REF_B", "3")
    monkeypatch.delenv("ACCELERATE_REF_C", raising=False)
    assert get_int_from_env(["ACCELERATE_REF_C", "ACCELERATE_REF_A", "ACCELERATE_REF_B"], 7) == 3
    assert get_int_from_env(["ACCELERATE_REF_C", "ACCELERATE_REF_A"], 7) == 7


def test_patch_environment_doc_example(monkeypatch):
    """env.patch_environment: the documented example, keys upper-cased, values str()."""
    monkeypatch.delenv("FOO", raising=False)
    monkeypatch.delenv("ACCELERATE_REF_NUM", raising=False)
    with patch_environment(FOO="bar", accelerate_ref_num=2):
        assert os.environ["FOO"] == "bar"
        assert os.environ["ACCELERATE_REF_NUM"] == "2"
        assert "accelerate_ref_num" not in os.environ
    assert "FOO" not in os.environ
    assert "ACCELERATE_REF_NUM" not in os.environ


def test_patch_environment_restores_previous_value_even_on_error(monkeypatch):
    monkeypatch.setenv("FOO", "before")
    with pytest.raises(RuntimeError):
        with patch_environment(FOO="inside"):
            assert os.environ["FOO"] == "inside"
            raise RuntimeError("boom")
    assert os.environ["FOO"] == "before"


def test_clear_environment_doc_example(monkeypatch):
    """env.clear_environment: empty inside, old environment back, changes discarded."""
    monkeypatch.setenv("FOO", "bar")
    before = dict(os.environ)
    with clear_environment():
        assert dict(os.environ) == {}
        os.environ["FOO"] = "new_bar"
        os.environ["ACCELERATE_REF_ONLY_INSIDE"] = "1"
        assert os.environ["FOO"] == "new_bar"
    assert os.environ["FOO"] == "bar"
    assert dict(os.environ) == before


def test_clear_environment_restores_on_error(monkeypatch):
    monkeypatch.setenv("FOO", "bar")
    with pytest.raises(KeyError):
        with clear_environment():
            os.environ["FOO"]
    assert os.environ["FOO"] == "bar"
