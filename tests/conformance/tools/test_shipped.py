"""HF's shipped self-test scripts with ``import accelerate`` switched (issue 20, item 2).

The switch itself is checked in this process; ``test_ops.py`` runs switched
at 2 ranks (a few seconds); the whole table, HF beside accelerate_ref, is
``extended``.
"""

import importlib
import sys

import pytest

from conformance.tools import shipped, switch


def test_switch_aliases_the_implementation_and_loads_hf_test_utils():
    import accelerate_ref
    import accelerate_ref.utils.operations as ref_operations

    before = sys.modules.get("accelerate")
    with switch.switched("accelerate_ref"):
        import accelerate
        import accelerate.utils.operations as operations
        from accelerate.test_utils import testing, training

        assert accelerate is accelerate_ref and operations is ref_operations
        assert operations.__spec__.name == "accelerate_ref.utils.operations"  # its own spec, not the alias's
        assert str(switch.hf_package_dir()) in training.__file__  # HF's file, not a copy
        assert training.RegressionModel.__module__ == "accelerate.test_utils.training"
        assert testing.AcceleratorState is accelerate_ref.AcceleratorState  # HF's helpers import the implementation
        assert testing.gather is ref_operations.gather
        with pytest.raises(ModuleNotFoundError, match="in the implementation 'accelerate_ref'.*no 'accelerate_ref.no_such"):
            import accelerate.no_such_module  # noqa: F401
    assert sys.modules.get("accelerate") is before
    assert not hasattr(accelerate_ref, "test_utils")
    assert not any(isinstance(finder, switch.ImplementationAlias) for finder in sys.meta_path)


def test_switch_to_accelerate_itself_switches_nothing():
    finders = list(sys.meta_path)
    with switch.switched("accelerate") as alias:
        assert alias is None and sys.meta_path == finders


def test_switch_command_refuses_in_one_line(capsys, tmp_path):
    assert switch.main(["--impl", "accelerate_ref", str(tmp_path / "missing.py")]) == 2
    script = tmp_path / "script.py"
    script.write_text("")
    assert switch.main(["--impl", "no_such_implementation", str(script)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and "script not found" in lines[0] and "no_such_implementation" in lines[1]


def test_last_exception_line_is_the_note():
    output = "Traceback (most recent call last):\n  File 'x'\n[rank 1] ValueError: bad input\nsimulators: rank 1 failed\n"
    assert shipped.last_exception(output) == "ValueError: bad input"


def test_hf_test_ops_passes_switched_to_accelerate_ref():
    """HF's operation checks at 2 ranks, debug-mode shape checks included (DistributedOperationException)."""
    outcome = shipped.run_script("test_ops.py", "accelerate_ref", timeout=120)
    assert outcome.status == "pass", outcome.error


@pytest.mark.extended
def test_every_shipped_script_that_passes_on_hf_passes_on_accelerate_ref():
    rows = shipped.run_all("accelerate_ref", shipped.shipped_scripts(), shipped.DEFAULT_SCRIPT_TIMEOUT,
                           progress=lambda line: None)
    assert any(row.hf.status == "pass" for row in rows)
    assert [row.script for row in rows if row.regression] == [], shipped.table(rows, "accelerate_ref")


@pytest.mark.parametrize("impl", ["accelerate", "accelerate_ref"])
def test_join_under_an_engine_without_ddp_warns_and_does_nothing(impl):
    """test_distributed_data_loop.py's test_join_raises_warning_for_non_ddp_distributed, on one process: HF 1.15's
    warning, on either implementation."""
    module = importlib.import_module(impl)
    state = importlib.import_module(f"{impl}.state")
    state.AcceleratorState._reset_state(True)
    try:
        accelerator = module.Accelerator(cpu=True)
        accelerator.state.distributed_type = module.DistributedType.FSDP
        with pytest.warns(UserWarning, match="only supported for multi-GPU training"):
            with accelerator.join_uneven_inputs([object()]) as inside:
                assert inside is None
    finally:
        state.AcceleratorState._reset_state(True)
        state.GradientState._reset_state()
