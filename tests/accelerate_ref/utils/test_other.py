"""`accelerate_ref.utils.other`: the small helpers, unwrapping a prepared model and loading with torch's safe
globals, each as HF accelerate 1.15's."""

from __future__ import annotations

import pytest
import torch

from accelerate_ref.utils import (
    convert_bytes,
    get_module_children_bottom_up,
    get_pretty_name,
    is_fp16_available,
    is_pytest_available,
    merge_dicts,
    recursive_getattr,
    str_to_bool,
)


class _Wrapper(torch.nn.Module):
    """A sublayer wrapper in the HF sense: it holds the real layer as `.module`."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.module = inner


def _nested_wrapped_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return _Wrapper(torch.nn.Sequential(_Wrapper(_Wrapper(torch.nn.Linear(2, 2))), torch.nn.Sequential(_Wrapper(torch.nn.ReLU()))))


def _layout(module: torch.nn.Module) -> list[tuple[str, str]]:
    return [(name, type(child).__name__) for name, child in module.named_modules()]


@pytest.mark.parametrize("recursive", [False, True])
def test_extract_model_from_parallel_recursive_matches_hf(recursive: bool) -> None:
    from accelerate.utils import extract_model_from_parallel as hf_extract

    from accelerate_ref.utils import extract_model_from_parallel as ref_extract

    layouts = [_layout(extract(_nested_wrapped_model(), recursive=recursive)) for extract in (ref_extract, hf_extract)]
    assert layouts[0] == layouts[1]
    assert ("_Wrapper" in {kind for _, kind in layouts[0]}) is not recursive


def test_torch_safe_globals_let_numpy_arrays_load_as_hf(tmp_path) -> None:
    import numpy as np
    from accelerate.utils import other as hf_other

    from accelerate_ref.utils import other as ref_other

    assert ref_other.TORCH_SAFE_GLOBALS == hf_other.TORCH_SAFE_GLOBALS
    path = tmp_path / "state.pt"
    saved = {"rng": np.random.RandomState(3).get_state()[1], "weights": torch.arange(4)}
    torch.save(saved, path)
    loaded = [module.load(path) for module in (ref_other, hf_other)]
    for got in loaded:
        assert np.array_equal(got["rng"], saved["rng"]) and torch.equal(got["weights"], saved["weights"])
    with pytest.raises(Exception, match="weights_only|Unsupported global"):
        torch.load(path, weights_only=True)  # what the safe globals add: plain torch refuses the array


def test_simple_helpers() -> None:
    assert convert_bytes(1536) == "1.5 KB" and convert_bytes(10) == "10 bytes"
    assert merge_dicts({"a": {"b": 1}}, {"a": {"c": 2}, "d": 3}) == {"a": {"b": 1, "c": 2}, "d": 3}
    model = torch.nn.Sequential(torch.nn.Linear(1, 1), torch.nn.Sequential(torch.nn.ReLU()))
    assert recursive_getattr(model, "1.0") is model[1][0]
    assert get_pretty_name(model) == "Sequential" and get_pretty_name(merge_dicts) == "merge_dicts"
    names = [name for name, _ in get_module_children_bottom_up(model, return_fqns=True)]
    assert names == ["0", "1.0", "1", ""] and get_module_children_bottom_up(model)[-1] is model
    assert str_to_bool("yes", to_bool=True) is True and str_to_bool("no") == 0
    assert is_pytest_available() and is_fp16_available()
