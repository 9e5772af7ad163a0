"""The differences an implementation keeps on purpose, each with its reason, in one TOML file.

::

    [[deviation]]
    probe = "utils.memory.release_memory_*"   # a probe name; fnmatch patterns allowed
    label = "release a model"                 # optional: one recorded call of the probe
    setting = "cuda/2"                        # optional: family/world where it applies
    reason = "the documents say ...; or HF bug, accelerate issue #1234"

A difference that matches an entry is *explained*; one that matches none is
*unexplained*; an entry that matched nothing in a run that ran its probe is
*stale* (the behaviours agree now, or the probe is gone), and both fail the
run. The reference implementation's file is ``accelerate_ref/DIFFERENTIAL.toml``.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

FILE_NAME = "DIFFERENTIAL.toml"


class DeviationFileError(Exception):
    """A deviation file that cannot be read: the CLI prints it as one line and exits 2."""


@dataclass(frozen=True)
class Deviation:
    probe: str
    reason: str
    label: str | None = None
    setting: str | None = None

    def matches(self, probe: str, label: str, setting: str) -> bool:
        return (fnmatch.fnmatchcase(probe, self.probe)
                and (self.label is None or self.label == label)
                and (self.setting is None or self.setting == setting))

    def applies_to(self, probe: str, setting: str) -> bool:
        """Whether a run of ``probe`` at ``setting`` could use this entry (for the stale check)."""
        return fnmatch.fnmatchcase(probe, self.probe) and self.setting in (None, setting)


def load(path: str | Path | None) -> list[Deviation]:
    """The entries of ``path``; none for no path or a missing bundled file."""
    if path is None or not Path(path).exists():
        return []
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise DeviationFileError(f"{path}: not valid TOML: {error}") from error
    entries = []
    for index, entry in enumerate(data.get("deviation", [])):
        if not entry.get("probe") or not entry.get("reason"):
            raise DeviationFileError(f"{path}: deviation {index + 1} needs a probe and a reason")
        entries.append(Deviation(str(entry["probe"]), str(entry["reason"]), entry.get("label"), entry.get("setting")))
    return entries


def bundled(impl: str) -> Path | None:
    """``<impl package>/DIFFERENTIAL.toml`` when the implementation is a package."""
    spec = importlib.util.find_spec(impl.split(".")[0])
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / FILE_NAME
