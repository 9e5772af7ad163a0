"""API parity: every public name of 🤗 Accelerate's documented modules, checked in an implementation.

The reference is the installed ``accelerate`` package. For each documented module
(``REFERENCE_MODULES``, plus every submodule of ``accelerate.utils`` and
``accelerate.commands``) the public names are its attributes not starting with
``_`` that the ``accelerate`` package defines (classes and functions whose
``__module__`` is under ``accelerate``, and plain constants), and for each public
class its public methods, properties and class attributes defined by
``accelerate`` classes in its MRO. Each name is looked up in the implementation
under the same path, with the top-level package renamed (``accelerate.utils.x``
-> ``accelerate_ref.utils.x``), and reported as:

* ``compatible``: present, and for a callable the same parameter names, kinds
  and defaults (annotations are ignored);
* ``different``: present with another signature;
* ``missing``: absent, or its module does not exist.

An exclusion file (``accelerate_ref/PARITY.toml`` for the reference) lists the
names left out on purpose with their reason (``[excluded]``: a key and its
reason, or a group ``[excluded."title"]`` with one ``reason`` for its
``names``) and those another open issue will supply (``[pending."issue N"]``). A gap not listed is
*unexplained*; a listed name that is present and compatible (or that the
reference no longer has) is *stale*. The check passes when neither exists.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import pkgutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REFERENCE = "accelerate"

#: The documented modules, walked as given; the packages in ``WALKED_PACKAGES`` add their submodules.
REFERENCE_MODULES = (
    "accelerate",
    "accelerate.accelerator",
    "accelerate.state",
    "accelerate.data_loader",
    "accelerate.optimizer",
    "accelerate.scheduler",
    "accelerate.tracking",
    "accelerate.logging",
    "accelerate.launchers",
    "accelerate.big_modeling",
    "accelerate.hooks",
    "accelerate.checkpointing",
    "accelerate.inference",
    "accelerate.local_sgd",
    "accelerate.utils",
    "accelerate.commands",
)
WALKED_PACKAGES = ("accelerate.utils", "accelerate.commands")

COMPATIBLE, DIFFERENT, MISSING = "compatible", "different", "missing"
_CONSTANT_TYPES = (str, bytes, int, float, bool, tuple, list, dict, set, frozenset, type(None))


class ParityUsageError(Exception):
    """Bad input to the parity check: the CLI prints it as one line and exits 2."""


@dataclass(frozen=True)
class Finding:
    """One public name of the reference and what the implementation has under it."""

    module: str
    qualname: str
    status: str
    detail: str = ""

    @property
    def key(self) -> str:
        return f"{self.module}:{self.qualname}"


@dataclass
class Exclusions:
    """Names listed on purpose: ``excluded`` (key -> reason) and ``pending`` (key -> issue)."""

    excluded: dict[str, str] = field(default_factory=dict)
    pending: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | Path | None) -> "Exclusions":
        if path is None or not Path(path).exists():
            return cls()
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as error:
            raise ParityUsageError(f"{path}: not valid TOML: {error}") from error
        excluded: dict[str, str] = {}
        for key, value in data.get("excluded", {}).items():
            if isinstance(value, dict):  # a group: one reason for many names
                excluded.update({str(name): str(value.get("reason", key)) for name in value.get("names", [])})
            else:
                excluded[str(key)] = str(value)
        pending: dict[str, str] = {}
        for issue, section in data.get("pending", {}).items():
            for name in section.get("names", []):
                pending[str(name)] = str(issue)
        return cls(excluded, pending)

    def reason(self, key: str) -> str | None:
        if key in self.excluded:
            return self.excluded[key]
        if key in self.pending:
            return f"pending: {self.pending[key]}"
        return None

    def keys(self) -> set[str]:
        return set(self.excluded) | set(self.pending)


@dataclass
class ParityReport:
    """Findings per module, and the gaps and stale entries measured against the exclusions."""

    impl: str
    findings: list[Finding]
    exclusions: Exclusions

    @property
    def gaps(self) -> list[Finding]:
        return [f for f in self.findings if f.status != COMPATIBLE]

    @property
    def unexplained(self) -> list[Finding]:
        return [f for f in self.gaps if self.exclusions.reason(f.key) is None]

    @property
    def stale(self) -> list[str]:
        """Listed names that need no listing: present and compatible, or gone from the reference."""
        gap_keys = {f.key for f in self.gaps}
        return sorted(self.exclusions.keys() - gap_keys)

    @property
    def ok(self) -> bool:
        return not self.unexplained and not self.stale

    def counts(self) -> dict[str, dict[str, int]]:
        """Per reference module: names, compatible, different, missing, excluded, pending, unexplained."""
        table: dict[str, dict[str, int]] = {}
        for finding in self.findings:
            row = table.setdefault(finding.module, dict.fromkeys(
                ("names", COMPATIBLE, DIFFERENT, MISSING, "excluded", "pending", "unexplained"), 0))
            row["names"] += 1
            row[finding.status] += 1
            if finding.status != COMPATIBLE:
                if finding.key in self.exclusions.excluded:
                    row["excluded"] += 1
                elif finding.key in self.exclusions.pending:
                    row["pending"] += 1
                else:
                    row["unexplained"] += 1
        return table

    def markdown(self) -> str:
        columns = ("names", COMPATIBLE, DIFFERENT, MISSING, "excluded", "pending", "unexplained")
        lines = ["| module | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
        totals = dict.fromkeys(columns, 0)
        for module, row in sorted(self.counts().items()):
            lines.append(f"| `{module}` | " + " | ".join(str(row[c]) for c in columns) + " |")
            for c in columns:
                totals[c] += row[c]
        lines.append("| **total** | " + " | ".join(str(totals[c]) for c in columns) + " |")
        return "\n".join(lines)


def _import_reference(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except Exception as error:  # an optional engine missing, a syntax error: the module does not import
        raise ParityUsageError(f"reference module {name!r} does not import: {type(error).__name__}: {error}") from error


def reference_modules(only: list[str] | None = None) -> list[str]:
    """The documented modules, with the submodules of the walked packages that import."""
    if only:
        for name in only:
            _import_reference(name)
        return list(only)
    names: list[str] = []
    for name in REFERENCE_MODULES:
        module = _import_reference(name)
        names.append(name)
        if name in WALKED_PACKAGES:
            for info in pkgutil.walk_packages(module.__path__, prefix=f"{name}."):
                try:
                    importlib.import_module(info.name)
                except Exception:  # a submodule needing an absent engine has nothing importable to compare
                    continue
                names.append(info.name)
    return names


def _defined_by_reference(value: Any) -> bool:
    module = getattr(value, "__module__", None) or ""
    return module == REFERENCE or module.startswith(f"{REFERENCE}.")


def _is_public_value(value: Any) -> bool:
    """A class or function defined by the reference, an enum member or a plain constant."""
    if inspect.ismodule(value):
        return False
    if inspect.isclass(value) or inspect.isroutine(value):
        return _defined_by_reference(value)
    if isinstance(value, enum.Enum):
        return _defined_by_reference(type(value))
    return isinstance(value, _CONSTANT_TYPES)


def public_names(module: ModuleType) -> Iterator[tuple[str, Any]]:
    """``(qualname, value)`` for the module's public names and their classes' public members.

    A plain module's public names are those it defines: a class or function it
    merely imports from another ``accelerate`` module is checked at its home (and
    in the packages that re-export it, whose ``__init__`` makes it public on purpose).
    """
    is_package = hasattr(module, "__path__")
    for name, value in sorted(vars(module).items()):
        if name.startswith("_") or not _is_public_value(value):
            continue
        home = getattr(value, "__module__", None) if (inspect.isclass(value) or inspect.isroutine(value)) else None
        if home is not None and home != module.__name__ and not is_package:
            continue
        yield name, value
        if inspect.isclass(value):
            yield from _class_members(name, value)


def _class_members(qualname: str, cls: type) -> Iterator[tuple[str, Any]]:
    seen: set[str] = set()
    for klass in cls.__mro__:
        if not _defined_by_reference(klass):
            continue
        for name, raw in vars(klass).items():
            if name.startswith("_") or name in seen:
                continue
            seen.add(name)
            yield f"{qualname}.{name}", raw


def _unwrap_member(raw: Any) -> Any:
    if isinstance(raw, (staticmethod, classmethod)):
        return raw.__func__
    return raw


def _lookup(impl_module: ModuleType | None, qualname: str) -> tuple[bool, Any]:
    """``(found, value)`` of ``qualname`` in the implementation's module (a class member raw, not bound)."""
    if impl_module is None:
        return False, None
    head, _, rest = qualname.partition(".")
    if not hasattr(impl_module, head):
        return False, None
    value = getattr(impl_module, head)
    if not rest:
        return True, value
    if not inspect.isclass(value):
        return False, None
    for klass in value.__mro__:  # the raw attribute, so a property is seen as one
        if rest in vars(klass):
            return True, vars(klass)[rest]
    if rest in getattr(value, "__dataclass_fields__", {}):
        return True, None
    return False, None


def _normalised_default(value: Any) -> Any:
    if value is inspect.Parameter.empty:
        return value
    if isinstance(value, enum.Enum):
        return ("enum", type(value).__name__, value.value)
    if inspect.isclass(value) or inspect.isroutine(value):
        return ("callable", getattr(value, "__qualname__", repr(value)))
    if isinstance(value, _CONSTANT_TYPES):
        return value
    return ("object", type(value).__name__)


def _signature(value: Any) -> inspect.Signature | None:
    target = value.fget if isinstance(value, property) else _unwrap_member(value)
    if isinstance(value, property) or not callable(target):
        return None
    try:
        return inspect.signature(target)
    except (TypeError, ValueError):
        return None


def compare_signatures(reference: Any, candidate: Any) -> str:
    """``""`` when the parameters (name, kind, default) agree, else what differs."""
    ref_kind, cand_kind = _member_kind(reference), _member_kind(candidate)
    if ref_kind != cand_kind and "value" not in (ref_kind, cand_kind):
        return f"a {cand_kind} where the reference has a {ref_kind}"
    ref_sig, cand_sig = _signature(reference), _signature(candidate)
    if ref_sig is None or cand_sig is None:
        return ""
    ref_params, cand_params = list(ref_sig.parameters.values()), list(cand_sig.parameters.values())
    ref_desc = [(p.name, p.kind.name, _normalised_default(p.default)) for p in ref_params]
    cand_desc = [(p.name, p.kind.name, _normalised_default(p.default)) for p in cand_params]
    if ref_desc == cand_desc:
        return ""
    return f"signature {_short(cand_sig)} where the reference has {_short(ref_sig)}"


def _short(sig: inspect.Signature) -> str:
    return "(" + ", ".join(str(p.replace(annotation=inspect.Parameter.empty)) for p in sig.parameters.values()) + ")"


def _member_kind(value: Any) -> str:
    if isinstance(value, property):
        return "property"
    if inspect.isclass(value):
        return "class"
    if callable(_unwrap_member(value)):
        return "callable"
    return "value"


def _impl_module(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name and (name == error.name or name.startswith(f"{error.name}.")):
            return None  # the module (or a parent of it) does not exist: its names are missing
        raise ParityUsageError(f"implementation module {name!r} does not import: {error}") from error
    except Exception as error:
        raise ParityUsageError(
            f"implementation module {name!r} does not import: {type(error).__name__}: {error}") from error


def _check_impl_package(impl: str) -> None:
    try:
        module = importlib.import_module(impl)
    except Exception as error:
        raise ParityUsageError(f"implementation {impl!r} does not import: {type(error).__name__}: {error}") from error
    if not hasattr(module, "__path__"):
        raise ParityUsageError(f"implementation {impl!r} is a module, not a package: parity needs its submodules")


def check(impl: str, exclusions: Exclusions | None = None, modules: list[str] | None = None) -> ParityReport:
    """Compare every public name of the reference modules with ``impl``'s (see the module docstring)."""
    _check_impl_package(impl)
    findings: list[Finding] = []
    for ref_name in reference_modules(modules):
        ref_module = importlib.import_module(ref_name)
        impl_module = _impl_module(impl + ref_name[len(REFERENCE):])
        for qualname, value in public_names(ref_module):
            found, candidate = _lookup(impl_module, qualname)
            if not found:
                findings.append(Finding(ref_name, qualname, MISSING))
                continue
            detail = compare_signatures(value, candidate) if candidate is not None else ""
            findings.append(Finding(ref_name, qualname, DIFFERENT if detail else COMPATIBLE, detail))
    return ParityReport(impl, findings, exclusions or Exclusions())


def bundled_exclusions(impl: str) -> Path | None:
    """``<impl package>/PARITY.toml`` when the implementation ships one."""
    try:
        module = importlib.import_module(impl)
    except Exception:
        return None
    path = Path(getattr(module, "__file__", "") or "").parent / "PARITY.toml"
    return path if path.is_file() else None
