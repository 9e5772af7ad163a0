"""Manifests: an implementation's known deviations from the documents.

A manifest is a TOML file with one ``[[deviation]]`` table per deviation::

    [[deviation]]
    id = "reduce.none"
    status = "FAIL"                  # the status the case is expected to end with
    worlds = ["2", "3", "4", "2x2"]  # optional: only at these worlds
    backends = ["sim"]               # optional: only on these backends
    case = "reduce_none"             # optional: only this case function of the ID
    reason = "reduce(t, 'none') sums instead of returning t (HF accelerate 1.15)"

A result matching a deviation becomes XFAIL. A matching case that passes is
an unexpected pass (a warning; an error with ``--strict``). Deviations that
match no case of the run are warned about, except those of backends or worlds
the run did not use (a ``sim-xla`` deviation in a ``sim`` run, a ``worlds =
["4"]`` deviation in a run at worlds 1 and 2).
"""

from __future__ import annotations

import sys
from collections.abc import Collection
from dataclasses import dataclass, field
from importlib import metadata, resources
from pathlib import Path

from .results import CaseResult, Status


def _installed_version(distribution: str) -> str | None:
    """The version of ``distribution`` as the import path finds it first, None when it is no distribution."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass(frozen=True)
class Deviation:
    id: str
    status: Status
    reason: str
    worlds: tuple[str, ...] = ()
    backends: tuple[str, ...] = ()
    case: str = ""

    def matches(self, result: CaseResult) -> bool:
        return (
            result.id == self.id
            and (not self.worlds or result.world in self.worlds)
            and (not self.backends or result.backend in self.backends)
            and (not self.case or result.case == self.case)
        )


@dataclass
class Manifest:
    source: str
    deviations: list[Deviation] = field(default_factory=list)
    _used: set[int] = field(default_factory=set)
    _backends: set[str] = field(default_factory=set)
    _worlds: set[str] = field(default_factory=set)

    @classmethod
    def load(cls, path: str | Path) -> "Manifest":
        text = Path(path).read_text(encoding="utf-8")
        return cls.parse(text, str(path))

    @classmethod
    def parse(cls, text: str, source: str) -> "Manifest":
        data = tomllib.loads(text)
        deviations = []
        for number, entry in enumerate(data.get("deviation", []), start=1):
            missing = [key for key in ("id", "status", "reason") if not entry.get(key)]
            if missing:
                raise ValueError(f"{source}: deviation #{number} lacks {', '.join(missing)}")
            try:
                status = Status(entry["status"].upper())
            except ValueError:
                raise ValueError(
                    f"{source}: deviation #{number} ({entry['id']}) has unknown status {entry['status']!r}"
                ) from None
            deviations.append(
                Deviation(
                    entry["id"],
                    status,
                    entry["reason"],
                    tuple(str(w) for w in entry.get("worlds", ())),
                    tuple(entry.get("backends", ())),
                    entry.get("case", ""),
                )
            )
        return cls(source, deviations)

    @classmethod
    def bundled(cls, impl_name: str, version: str | None = None) -> "Manifest | None":
        """The manifest shipped for the implementation: ``conformance/manifests/<impl>-<version>.toml`` for its
        installed version (``version``, else its distribution's) where the suite has one (``accelerate-0.27.2``,
        the release the v0.27 documents describe), else ``<impl>.toml``, else None."""
        top = impl_name.split(".")[0]
        version = version or _installed_version(top)
        for name in ([f"{top}-{version}.toml"] if version else []) + [f"{top}.toml"]:
            resource = resources.files("conformance").joinpath("manifests", name)
            if resource.is_file():
                return cls.parse(resource.read_text(encoding="utf-8"), f"conformance/manifests/{name}")
        return None

    def expects(self, result: CaseResult, status: Status) -> bool:
        """Whether a deviation matching ``result`` expects ``status`` (nothing is marked)."""
        return any(d.status == status and d.matches(result) for d in self.deviations)

    def apply(self, result: CaseResult) -> CaseResult:
        """Mark ``result`` XFAIL (or an unexpected pass) where a deviation matches it.

        Of several matching deviations, one expecting the result's status wins,
        one naming the result's backend before one for every backend (so a
        ``sim-xla`` entry explains an XLA-only cause of a failure that a
        general entry also lists); otherwise the first one in the file.
        """
        self._backends.add(result.backend)
        self._worlds.add(result.world)
        matching = [index for index, deviation in enumerate(self.deviations) if deviation.matches(result)]
        if not matching:
            return result
        index = min(matching, key=lambda i: (self.deviations[i].status != result.status, not self.deviations[i].backends))
        deviation = self.deviations[index]
        self._used.update(matching)
        if result.status == deviation.status:
            result.status = Status.XFAIL
            result.manifest_reason = deviation.reason
        elif result.status == Status.PASS:
            result.unexpected_pass = True
            result.manifest_reason = deviation.reason
        return result

    def unused(self, among: Collection[str] | None = None) -> list[Deviation]:
        """Deviations that matched no result so far, among those of the backends and worlds results came from (and,
        given ``among``, of those case IDs: the cases a run selected)."""
        return [
            d for i, d in enumerate(self.deviations)
            if i not in self._used
            and (among is None or d.id in among)
            and (not d.backends or self._backends.intersection(d.backends))
            and (not d.worlds or self._worlds.intersection(d.worlds))
        ]
