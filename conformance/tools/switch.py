"""Run a script written for HF accelerate on another implementation, ``import accelerate`` switched at run time.

    python -m conformance.tools.switch --impl accelerate_ref SCRIPT [ARGS...]

runs SCRIPT as ``python SCRIPT ARGS...`` would (``__main__``, ``sys.argv``,
the script's folder first on ``sys.path``), with the switch installed first.

Rules of the switch (:func:`install`, :func:`switched`):

- ``accelerate`` and every ``accelerate.<sub>`` resolve to the
  implementation's module of the same path, ``<impl>.<sub>``: one module
  object under both names in ``sys.modules`` (an alias, never a copy), so
  ``accelerate.utils.gather is <impl>.utils.gather`` and classes keep their
  ``<impl>`` ``__module__``.
- ``accelerate.test_utils`` and everything under it are HF's own files from
  HF accelerate's installed package (the scripts' helpers: RegressionDataset,
  RegressionModel, the ``require_*`` decorators, the scripts themselves),
  loaded under their ``accelerate.test_utils.*`` names. Their imports of
  ``accelerate`` and relative ``..utils`` resolve through the switch, so HF's
  helpers run as clients of the implementation.
- An ``accelerate.<sub>`` the implementation lacks raises
  ModuleNotFoundError (an ImportError) naming the implementation and the
  missing ``<impl>.<sub>``: the switch never falls back to HF's module, which
  would test HF where the implementation was meant.
- ``--impl accelerate`` switches nothing: HF runs under the same launch.
- The switch holds in this process and in processes forked from it; a Python
  started afresh (``spawn``, a subprocess) imports HF accelerate unless it
  starts through this module too.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import runpy
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

from simulators.cli import OneLineParser

#: The package name scripts import.
ALIAS = "accelerate"
#: HF's helpers for its own scripts: always HF's files, importing the implementation.
TEST_UTILS = f"{ALIAS}.test_utils"


def _aliased(name: str) -> bool:
    return name == ALIAS or name.startswith(ALIAS + ".")


def hf_package_dir() -> Path:
    """The folder of HF accelerate's installed package, found without importing it."""
    spec = importlib.machinery.PathFinder.find_spec(ALIAS)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the switch loads accelerate.test_utils from HF accelerate's installed package; none found")
    return Path(next(iter(spec.submodule_search_locations)))


class ImplementationAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A meta-path finder and loader that answers ``accelerate.*`` with the implementation's modules."""

    def __init__(self, impl: str, hf_dir: Path) -> None:
        self.impl = impl
        self.hf_dir = hf_dir

    def target(self, name: str) -> str:
        """The implementation's module name for ``accelerate[.<sub>]``."""
        return self.impl + name[len(ALIAS):]

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if not _aliased(fullname) or fullname.startswith(TEST_UTILS + "."):
            return None  # not ours; HF's test_utils children are found on their parent's HF __path__
        if fullname == TEST_UTILS:
            return importlib.machinery.PathFinder.find_spec(fullname, [str(self.hf_dir)])
        real = self.target(fullname)
        if importlib.util.find_spec(real) is None:
            raise ModuleNotFoundError(
                f"No module named {fullname!r} in the implementation {self.impl!r} (switched: no {real!r}); "
                "the switch does not fall back to HF accelerate",
                name=fullname,
            )
        module = importlib.import_module(real)
        spec = importlib.machinery.ModuleSpec(fullname, self, is_package=hasattr(module, "__path__"))
        spec.loader_state = (module, module.__spec__)
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return spec.loader_state[0]

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run (the implementation's module ran under its own name); give it back its own spec,
        which the import system replaced with the alias's."""
        module.__spec__ = module.__spec__.loader_state[1]


def _names_under(prefix: str) -> list[str]:
    return [name for name in sys.modules if name == prefix or name.startswith(prefix + ".")]


def install(impl: str) -> ImplementationAlias | None:
    """Switch ``accelerate`` to ``impl`` in this process for good; None for ``impl == "accelerate"`` (no switch).

    HF modules already imported under ``accelerate.*`` are dropped from
    ``sys.modules`` first, so the next import goes through the switch.
    """
    if impl == ALIAS:
        return None
    importlib.import_module(impl)  # a missing implementation fails here, naming itself
    alias = ImplementationAlias(impl, hf_package_dir())
    for name in _names_under(ALIAS):
        del sys.modules[name]
    sys.meta_path.insert(0, alias)
    return alias


@contextlib.contextmanager
def switched(impl: str) -> Iterator[ImplementationAlias | None]:
    """:func:`install` for a block: afterwards the switch is gone and ``sys.modules``' ``accelerate.*``
    entries are as they were (the implementation's own modules stay imported under their names, without
    the ``test_utils`` attribute the import system gave the implementation's package)."""
    saved = {name: sys.modules[name] for name in _names_under(ALIAS)}
    alias = install(impl)
    try:
        yield alias
    finally:
        if alias is not None:
            sys.meta_path.remove(alias)
            package = sys.modules[impl]
            if getattr(package, "test_utils", None) is sys.modules.get(TEST_UTILS):
                del package.test_utils
            for name in _names_under(ALIAS):
                del sys.modules[name]
            sys.modules.update(saved)


def run_script(script: str, args: Sequence[str]) -> None:
    """Run ``script`` as ``python script *args`` would, in this process."""
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m conformance.tools.switch", description=__doc__.splitlines()[0])
    parser.add_argument("--impl", required=True, help="the implementation package ('accelerate': no switch)")
    parser.add_argument("script", help="a Python script that imports accelerate")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    options = parser.parse_args(argv)
    if not os.path.isfile(options.script):
        print(f"conformance.tools.switch: script not found: {options.script}", file=sys.stderr)
        return 2
    try:
        install(options.impl)
    except ImportError as error:
        print(f"conformance.tools.switch: {error}", file=sys.stderr)
        return 2
    run_script(options.script, options.args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
