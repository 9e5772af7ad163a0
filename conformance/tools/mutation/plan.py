"""What a mutation run mutates, what it runs against each mutant, and which mutants it skips.

The map (``conformance/mutation.toml``) names, per public module of ``accelerate_ref``, the files its code
lives in and the slice of the suite that covers it::

    [module."accelerate_ref.hooks"]
    paths = ["accelerate_ref/hooks.py"]          # relative to the repository root
    worlds = "1"                                 # --worlds of the slice
    patterns = ["bigmodel.*", "hooks.*"]         # -k patterns of the slice (catalog ID globs)
    backends = ["sim", "sim-npu"]                # optional: each runs the slice (default ["sim"])
    probes = ["hooks.*"]                         # optional: differential probes run too (-k patterns)
    settings = ["cpu/1", "cuda/1"]               # optional: where the probes run (default DIFFERENTIAL_SETTINGS)
    tests = ["tests/accelerate_ref/test_hooks.py::test_x"]   # optional: the project's own tests run last

A module whose rules show only across several devices (inputs following a model dispatched over accelerators)
names ``sim-npu`` too: the slice then runs on each backend in turn, and a failure on either kills the mutant.
``probes`` adds the module's differential probes (``python -m conformance differential``, against HF
accelerate, at ``DIFFERENTIAL_SETTINGS``): public behaviour the documents do not state (a helper's exact
result, an error's text) that HF 1.15 fixes, so a mutant there that no documented rule reaches still differs;
``settings`` names other family/world settings for them (the mock CUDA family, where a hook's moves between
a GPU and the CPU show).
``tests`` adds the project's own tests (pytest node IDs) for rules of the reference that neither the suite nor
a probe can pin: a deliberate deviation from HF (``pad_input_tensors`` follows HF's docstring, not its code) or
a helper whose HF result is not deterministic (``gather_tensor_shape`` reduces an uninitialised buffer).

The equivalents file (``conformance/mutation_equivalent.toml``) lists mutants reviewed as equivalent (no test can
tell them from the original); they are reported as such and never run::

    [[equivalent]]
    path = "accelerate_ref/hooks.py"
    operator = "core/NumberReplacer"
    occurrence = 3                               # cosmic-ray's index of the operator's site in the file
    source = "return 0"                          # the stripped line the mutant changes: a guard against drift
    reason = "why no behaviour can differ"

A mutant inside a type annotation of a module that starts with ``from __future__ import annotations`` is
equivalent by construction (:func:`annotation_equivalents`): the annotation stays a string that nothing in
``accelerate_ref`` evaluates. Such mutants need no entry.
"""

from __future__ import annotations

import ast
import fnmatch
import random
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from ... import catalog
from ...engine.backends import BACKENDS
from ...engine.runner import parse_worlds
from ..differential.probe import all_probes
from ..differential.runner import SETTINGS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: The repository root: the map's paths are relative to it.
ROOT = Path(__file__).resolve().parents[3]
MAP = ROOT / "conformance" / "mutation.toml"
EQUIVALENTS = ROOT / "conformance" / "mutation_equivalent.toml"
#: The backends a slice may run on: the simulator's (a mutation run needs no hardware).
SIMULATED = tuple(backend for backend in BACKENDS if backend != "native")
#: Where a slice's differential probes run unless its module names ``settings``: the CPU at one, two and three
#: processes (a setting no chosen probe declares costs nothing).
DIFFERENTIAL_SETTINGS = ("cpu/1", "cpu/2", "cpu/3")


class PlanError(Exception):
    """A map, equivalents file or selection that cannot be used: the CLI prints it as one line."""


@dataclass(frozen=True)
class Slice:
    """One module of ``accelerate_ref``: the files mutated and the suite's slice that must kill their mutants."""

    module: str
    paths: tuple[str, ...]
    worlds: str
    patterns: tuple[str, ...]
    backends: tuple[str, ...] = ("sim",)
    probes: tuple[str, ...] = ()
    tests: tuple[str, ...] = ()
    settings: tuple[str, ...] = DIFFERENTIAL_SETTINGS

    def command(self, python: str = sys.executable) -> list[str]:
        """The conformance runs (one per backend, then the probes, then the project's tests, stopping at the first
        that fails) whose non-zero exit kills a mutant."""
        runs = [self._run(backend, python) for backend in self.backends]
        if self.probes:
            runs.append([python, "-m", "conformance", "differential", "--impl", "accelerate_ref",
                         "--settings", ",".join(self.settings), *(arg for probe in self.probes for arg in ("-k", probe))])
        if self.tests:
            runs.append([python, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *self.tests])
        return runs[0] if len(runs) == 1 else ["sh", "-c", " && ".join(shlex.join(run) for run in runs)]

    def _run(self, backend: str, python: str) -> list[str]:
        args = [python, "-m", "conformance", "run", "--impl", "accelerate_ref", "--backend", backend, "--worlds", self.worlds]
        for pattern in self.patterns:
            args += ["-k", pattern]
        return args


@dataclass(frozen=True)
class Mutant:
    """One mutant as cosmic-ray enumerates it: ``occurrence`` counts the operator's sites in ``path`` from 0;
    ``span`` is the (line, column) of the first and past the last character it changes."""

    path: str
    operator: str
    occurrence: int
    line: int
    source: str
    span: tuple[tuple[int, int], tuple[int, int]] | None = field(default=None, compare=False)

    @property
    def key(self) -> tuple[str, str, int]:
        return self.path, self.operator, self.occurrence


@dataclass(frozen=True)
class Equivalent:
    path: str
    operator: str
    occurrence: int
    source: str
    reason: str

    @property
    def key(self) -> tuple[str, str, int]:
        return self.path, self.operator, self.occurrence


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise PlanError(f"cannot read {path}: {error.strerror}") from error
    except tomllib.TOMLDecodeError as error:
        raise PlanError(f"{path}: {error}") from error


def _strings(value: Any, where: str, name: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(item, str) and item for item in value):
        raise PlanError(f"{where}: {name} must be a non-empty list of strings")
    return tuple(value)


def load_map(path: Path = MAP, root: Path = ROOT) -> list[Slice]:
    """The map's slices, in file order, each checked: its files exist under ``root``, its worlds parse,
    and every pattern matches a catalog ID (a pattern that matches nothing would leave mutants to survive)."""
    modules = _read_toml(path).get("module")
    if not isinstance(modules, dict) or not modules:
        raise PlanError(f"{path}: no [module.\"...\"] table")
    ids = [entry.id for entry in catalog.entries()]
    probe_names = [probe.name for probe in all_probes()]
    slices = []
    for name, table in modules.items():
        where = f"{path.name}: module {name}"
        unknown = sorted(set(table) - {"paths", "worlds", "patterns", "backends", "probes", "tests", "settings"})
        if unknown:
            raise PlanError(f"{where}: unknown key {unknown[0]!r}")
        paths = _strings(table.get("paths"), where, "paths")
        missing = [p for p in paths if not (root / p).is_file()]
        if missing:
            raise PlanError(f"{where}: no file {missing[0]}")
        worlds = table.get("worlds")
        if not isinstance(worlds, str):
            raise PlanError(f"{where}: worlds must be a string such as \"1,2\"")
        try:
            parse_worlds(worlds)
        except ValueError as error:
            raise PlanError(f"{where}: worlds: {error}") from error
        patterns = _strings(table.get("patterns"), where, "patterns")
        idle = [p for p in patterns if not fnmatch.filter(ids, p)]
        if idle:
            raise PlanError(f"{where}: pattern {idle[0]!r} matches no catalog ID")
        backends = _strings(table.get("backends", ["sim"]), where, "backends")
        odd = [backend for backend in backends if backend not in SIMULATED]
        if odd:
            raise PlanError(f"{where}: backend {odd[0]!r} is not one of {', '.join(SIMULATED)}")
        probes = _strings(table["probes"], where, "probes") if "probes" in table else ()
        silent = [p for p in probes if not fnmatch.filter(probe_names, p)]
        if silent:
            raise PlanError(f"{where}: probe pattern {silent[0]!r} matches no differential probe")
        settings = _strings(table.get("settings", list(DIFFERENTIAL_SETTINGS)), where, "settings")
        strange = [setting for setting in settings if setting not in SETTINGS]
        if strange:
            raise PlanError(f"{where}: setting {strange[0]!r} is not one of {', '.join(SETTINGS)}")
        tests = _strings(table["tests"], where, "tests") if "tests" in table else ()
        absent = [test for test in tests if not (root / test.split("::", 1)[0]).is_file()]
        if absent:
            raise PlanError(f"{where}: test {absent[0]!r} names no file")
        slices.append(Slice(name, paths, worlds, patterns, backends, probes, tests, settings))
    return slices


def select(slices: Sequence[Slice], names: Sequence[str]) -> list[Slice]:
    """The slices named (a name may be a module's last dotted part, e.g. ``hooks``), in map order; all for none."""
    if not names:
        return list(slices)
    chosen = set()
    for name in names:
        found = [s.module for s in slices if name in (s.module, s.module.rsplit(".", 1)[-1])]
        if len(found) != 1:
            raise PlanError(f"unknown module {name!r}; choose from {', '.join(s.module for s in slices)}")
        chosen.add(found[0])
    return [s for s in slices if s.module in chosen]


def load_equivalents(path: Path = EQUIVALENTS) -> list[Equivalent]:
    """The reviewed equivalent mutants; each entry carries every field, a reason, and appears once."""
    entries = _read_toml(path).get("equivalent", [])
    if not isinstance(entries, list):
        raise PlanError(f"{path.name}: equivalent must be an array of tables ([[equivalent]])")
    found: list[Equivalent] = []
    for number, entry in enumerate(entries, 1):
        where = f"{path.name}: entry {number}"
        fields = {"path": str, "operator": str, "occurrence": int, "source": str, "reason": str}
        for name, kind in fields.items():
            value = entry.get(name)
            if not isinstance(value, kind) or isinstance(value, bool) or value in ("", None):
                raise PlanError(f"{where}: {name} missing or not a {kind.__name__}")
        unknown = sorted(set(entry) - set(fields))
        if unknown:
            raise PlanError(f"{where}: unknown key {unknown[0]!r}")
        equivalent = Equivalent(**{name: entry[name] for name in fields})
        if any(other.key == equivalent.key for other in found):
            raise PlanError(f"{where}: {equivalent.path} {equivalent.operator} #{equivalent.occurrence} listed twice")
        found.append(equivalent)
    return found


def match_equivalents(mutants: Iterable[Mutant], equivalents: Iterable[Equivalent],
                      paths: Sequence[str]) -> dict[tuple[str, str, int], Equivalent]:
    """The equivalents of the mutants of ``paths``, by mutant key.

    An entry about one of ``paths`` that names no generated mutant, or whose ``source`` is no longer the line the
    mutant changes, is stale (the code moved under it): an error, so that no mutant is skipped unreviewed.
    """
    by_key = {mutant.key: mutant for mutant in mutants}
    matched = {}
    for equivalent in equivalents:
        if equivalent.path not in paths:
            continue
        mutant = by_key.get(equivalent.key)
        if mutant is None or mutant.source != equivalent.source.strip():
            raise PlanError(f"stale equivalent {equivalent.path} {equivalent.operator} #{equivalent.occurrence}: "
                            f"the mutant no longer changes {equivalent.source.strip()!r}; review it again")
        matched[equivalent.key] = equivalent
    return matched


#: The reason :func:`annotation_equivalents` gives.
ANNOTATION_REASON = ("it changes a type annotation, which `from __future__ import annotations` keeps as a string "
                     "that nothing in accelerate_ref evaluates")


def annotation_spans(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The (line, column) spans of ``source``'s annotations (arguments, returns, annotated assignments), if the
    module postpones their evaluation (``from __future__ import annotations``); none otherwise."""
    tree = ast.parse(source)
    postponed = any(isinstance(node, ast.ImportFrom) and node.module == "__future__"
                    and any(alias.name == "annotations" for alias in node.names) for node in tree.body)
    if not postponed:
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            found.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            found.append(node.annotation)
    return [((a.lineno, a.col_offset), (a.end_lineno, a.end_col_offset)) for a in found if a is not None]


def annotation_equivalents(mutants: Iterable[Mutant], sources: dict[str, str]) -> dict[tuple[str, str, int], Equivalent]:
    """The mutants (by key) that change only an annotation of their file (``sources``: path -> text), each as an
    :class:`Equivalent` with :data:`ANNOTATION_REASON`."""
    spans = {path: annotation_spans(text) for path, text in sources.items()}
    found = {}
    for mutant in mutants:
        if mutant.span is None:
            continue
        start, end = mutant.span
        if any(low <= start and end <= high for low, high in spans.get(mutant.path, ())):
            found[mutant.key] = Equivalent(mutant.path, mutant.operator, mutant.occurrence, mutant.source,
                                           ANNOTATION_REASON)
    return found


def draw(mutants: Sequence[Mutant], size: int, seed: int, module: str) -> list[Mutant]:
    """``size`` mutants (all when fewer) drawn at random from ``mutants``, in the order they are to run.

    The draw depends only on the seed, the module's name and the set of mutants (not on their order), so a run
    repeats with the same seed and each module's draw is independent of which other modules run.
    """
    pool = sorted(mutants, key=lambda mutant: mutant.key)
    return random.Random(f"{seed}/{module}").sample(pool, min(size, len(pool)))
