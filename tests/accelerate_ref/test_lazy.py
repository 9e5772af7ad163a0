"""accelerate_ref's packages load their re-exports on first use (accelerate_ref._lazy; issue 11's start-up goal)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest

import accelerate_ref
import accelerate_ref.utils


def _imported_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(m for m in sys.modules if m.startswith('accelerate_ref')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return set(done.stdout.split())


def test_the_launcher_does_not_import_the_accelerator():
    loaded = _imported_after("import accelerate_ref.commands.accelerate_cli")
    heavy = sorted(loaded & {"accelerate_ref.accelerator", "accelerate_ref.state", "accelerate_ref.utils.modeling", "accelerate_ref.big_modeling"})
    assert heavy == [], f"`accelerate-ref launch` needs none of these at start-up: {heavy}"


@pytest.mark.parametrize("package", [accelerate_ref, accelerate_ref.utils], ids=lambda p: p.__name__)
def test_every_listed_name_resolves_and_is_listed_by_dir(package):
    missing = [name for name in package._EXPORTS if not hasattr(package, name)]
    assert missing == [], f"names {package.__name__} lists but cannot load: {missing}"
    assert set(package.__all__) <= set(dir(package)), "every name of __all__ is in dir()"
    assert accelerate_ref.utils.modeling.__name__ == "accelerate_ref.utils.modeling", "a submodule by attribute"
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        package.not_a_name


@pytest.mark.extended
def test_every_module_imports_first_without_a_cycle():
    """With nothing imported eagerly, each module may be the first one a user imports."""
    names = ["accelerate_ref"] + [m.name for m in pkgutil.walk_packages(accelerate_ref.__path__, "accelerate_ref.")]
    failed = {}
    for name in names:
        done = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True, timeout=120)
        if done.returncode:
            failed[name] = done.stderr.strip().splitlines()[-1]
    assert failed == {}, f"modules that fail as the first import: {failed}"
