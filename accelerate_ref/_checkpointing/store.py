"""Checkpoint directories that become visible only when complete.

Names in a checkpoint's parent directory::

    <name>/                          published: complete, loadable
    .<name>.partial-<token>/         being written, or left by a crash (never loaded)
    .<name>.replaced-<token>/        the previous <name>, set aside while a new one is renamed in
    .<name>.deleting-<token>/        a checkpoint `total_limit` removes

A checkpoint is written under its ``.partial`` name; every file in it is
fsynced as it is written; when every process has written its part, the
manifest (`MANIFEST_NAME`: the world size and every file with its size) is
written, the directory fsynced and renamed to ``<name>``, and the parent
fsynced. A crash at any point leaves the published checkpoints as they
were. Replacing an existing ``<name>`` takes two renames (old aside, new
in); a crash between them leaves ``<name>`` missing, and loading ``<name>``
then finds the one set aside (the last one published under that name).
Deleting renames first, so a half-deleted checkpoint is never visible.

HF accelerate writes its checkpoints in place, without a manifest. A
folder without one that holds ``random_states_0.pkl`` (which every
``save_state`` writes, on process 0, after the models, optimizers,
schedulers and loader states) is taken for such a checkpoint: it loads,
counts among the automatically named ones (the newest loads, the oldest
are deleted for ``total_limit``), and saving to its name replaces it, so
that a project switching libraries keeps its checkpoints. HF saving into a
published folder leaves its manifest behind, describing files HF has
overwritten; `verify` recognises that and does not hold the folder to it.

Catalog: save_state.roundtrip, save_state.auto_naming, save_state.total_limit.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import zipfile
from typing import Optional

from ..utils.constants import RNG_STATE_NAME
from ..utils._other.serialization import fsync_directory, write_atomically

#: File in every published checkpoint listing the world size and each file's size.
MANIFEST_NAME = "checkpoint.json"
#: Process 0's random states, in every checkpoint: marks one HF accelerate wrote (it writes no manifest).
MAIN_RNG_FILE = f"{RNG_STATE_NAME}_0.pkl"
#: Folder under ``project_dir`` that automatic checkpoint naming writes into.
CHECKPOINTS_FOLDER = "checkpoints"
#: Published names under automatic naming: ``checkpoint_<iteration>``.
AUTOMATIC_NAME = re.compile(r"checkpoint_(\d+)")
_HIDDEN = re.compile(r"\.(?P<name>.+)\.(?P<kind>partial|replaced|deleting)-(?P<token>[0-9a-f]+)")


class CheckpointError(ValueError):
    """A checkpoint that cannot be saved or loaded as asked; the message names the directory or file."""


def hidden_path(target: str, kind: str, token: str) -> str:
    """``<parent>/.<name>.<kind>-<token>`` for checkpoint directory ``target``. Catalog: save_state.auto_naming."""
    parent, name = os.path.split(os.path.abspath(target))
    return os.path.join(parent, f".{name}.{kind}-{token}")


def is_published(path: str) -> bool:
    """Whether ``path`` is a checkpoint `publish` completed (a directory holding the manifest).

    Catalog: save_state.auto_naming, save_state.total_limit.
    """
    return os.path.isfile(os.path.join(path, MANIFEST_NAME))


def is_checkpoint(path: str) -> bool:
    """Whether ``path`` is a checkpoint: published here, or one HF accelerate wrote (``random_states_0.pkl``,
    no manifest).

    Catalog: save_state.auto_naming, save_state.total_limit.
    """
    return is_published(path) or os.path.isfile(os.path.join(path, MAIN_RNG_FILE))


def check_replaceable(target: str) -> None:
    """Refuse to save over ``target`` unless it is absent, empty or a checkpoint (`is_checkpoint`), which is replaced.

    A directory holding anything else may be the user's data; replacing it
    would delete that. Raised before anything is written. Catalog: save_state.roundtrip.
    """
    if os.path.isdir(target) and os.listdir(target) and not is_checkpoint(target):
        raise CheckpointError(
            f"{target} exists and is not a checkpoint written by save_state (it has neither {MANIFEST_NAME} nor "
            f"{MAIN_RNG_FILE}); save to a new or empty directory, or remove it first"
        )
    if os.path.exists(target) and not os.path.isdir(target):
        raise CheckpointError(f"{target} exists and is a file, not a checkpoint directory")


def open_staging(target: str, token: str) -> bool:
    """Create the ``.partial`` directory of ``target`` unless this process sees it already; True if it created it.

    The process that creates a staging directory publishes it: on a file
    system all processes share that is the main process alone (the others
    call this after it and find the directory); on machines that do not
    share one, the first process of each machine. Catalog: save_state.roundtrip.
    """
    staging = hidden_path(target, "partial", token)
    os.makedirs(os.path.dirname(staging), exist_ok=True)
    try:
        os.mkdir(staging)
    except FileExistsError:
        return False
    return True


def _file_sizes(folder: str) -> dict[str, int]:
    """Every file under ``folder`` but the manifest: relative path -> bytes."""
    sizes = {}
    for parent, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(parent, name)
            sizes[os.path.relpath(path, folder)] = os.path.getsize(path)
    sizes.pop(MANIFEST_NAME, None)
    return dict(sorted(sizes.items()))


def write_manifest(staging: str, num_processes: int) -> None:
    """Record the world size and every file of ``staging`` (relative path -> bytes), atomically.

    Catalog: save_state.roundtrip.
    """
    manifest = {"format": 1, "num_processes": num_processes, "files": _file_sizes(staging)}
    write_atomically(os.path.join(staging, MANIFEST_NAME), lambda stream: stream.write(json.dumps(manifest, indent=1).encode()))


def publish(staging: str, target: str, token: str) -> None:
    """Make the complete ``staging`` directory visible as ``target`` (replacing a published one), durably.

    Catalog: save_state.roundtrip, save_state.auto_naming.
    """
    parent = os.path.dirname(os.path.abspath(target))
    fsync_directory(staging)
    if os.path.exists(target):
        aside = hidden_path(target, "replaced", token)
        os.rename(target, aside)
        os.rename(staging, target)
        fsync_directory(parent)
        shutil.rmtree(aside)
    else:
        os.rename(staging, target)
        fsync_directory(parent)


def discard(staging: str) -> None:
    """Remove a staging directory of a save that failed. Catalog: save_state.roundtrip."""
    shutil.rmtree(staging, ignore_errors=True)


def remove_leftovers(parent: str, name: Optional[str] = None, keep: str = "") -> None:
    """Remove what interrupted saves and deletions left in ``parent`` (only those of checkpoint ``name`` if given).

    Called by the process that just published, after publishing: a
    ``.replaced`` copy is then older than the published checkpoint.
    Entries with token ``keep`` (the save under way) stay. Catalog: save_state.auto_naming.
    """
    for entry in os.listdir(parent):
        match = _HIDDEN.fullmatch(entry)
        if match and match["token"] != keep and (name is None or match["name"] == name):
            shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)


def published_in(folder: str) -> list[tuple[int, str]]:
    """``(iteration, path)`` of every ``checkpoint_<iteration>`` in ``folder`` that `is_checkpoint`, oldest first.

    Catalog: save_state.auto_naming, save_state.total_limit.
    """
    if not os.path.isdir(folder):
        return []
    found = []
    for entry in os.listdir(folder):
        match = AUTOMATIC_NAME.fullmatch(entry)
        path = os.path.join(folder, entry)
        if match and is_checkpoint(path):
            found.append((int(match.group(1)), path))
    return sorted(found)


def prune(folder: str, total_limit: int, token: str) -> None:
    """Delete the oldest checkpoints of ``folder`` until ``total_limit`` remain.

    Only checkpoints (`published_in`) count and are deleted, never one
    being written; each is renamed aside before it is removed.
    Catalog: save_state.total_limit.
    """
    published = published_in(folder)
    for _, path in published[: max(len(published) - total_limit, 0)]:
        doomed = hidden_path(path, "deleting", token)
        os.rename(path, doomed)
        fsync_directory(folder)
        shutil.rmtree(doomed)


def resolve(path: str) -> str:
    """The checkpoint to load for ``path``: ``path`` itself, or, if a replacement was interrupted, the one set aside.

    A missing folder (a file too) is HF 1.15's ValueError "Tried to find <path> but folder does not exist".
    Catalog: save_state.roundtrip.
    """
    if os.path.isdir(path):
        return path
    parent, name = os.path.split(os.path.abspath(path))
    if os.path.isdir(parent):
        aside = [
            os.path.join(parent, entry)
            for entry in os.listdir(parent)
            if (match := _HIDDEN.fullmatch(entry)) and match["kind"] == "replaced" and match["name"] == name
        ]
        complete = [candidate for candidate in aside if is_published(candidate)]
        if complete:
            return max(complete, key=os.path.getmtime)
    raise ValueError(f"Tried to find {path} but folder does not exist")  # HF's words


def _reads_whole(path: str) -> bool:
    """Whether ``path`` is a complete safetensors or ``torch.save`` (zip) file, judged by its own structure."""
    try:
        if path.endswith(".safetensors"):
            with open(path, "rb") as stream:
                header_size = int.from_bytes(stream.read(8), "little")
                header = json.loads(stream.read(header_size))
            ends = (entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__")
            data_end = max(ends, default=0)
            return os.path.getsize(path) == 8 + header_size + data_end
        with zipfile.ZipFile(path) as archive:
            return archive.testzip() is None
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile):
        return False


def _rewritten_in_place(path: str, listed: dict[str, int]) -> bool:
    """Whether another writer saved into published ``path`` since: files the manifest does not list, or a listed
    file of another size that is whole (HF accelerate saves over a folder's files in place, manifest untouched)."""
    found = _file_sizes(path)
    if set(found) - set(listed):
        return True
    changed = [name for name, size in listed.items() if name in found and found[name] != size]
    return any(_reads_whole(os.path.join(path, name)) for name in changed)


def verify(path: str, num_processes: int) -> None:
    """Check a published checkpoint before anything is loaded from it.

    Rules: the world size it was saved at must be this one; every file
    its manifest lists must be there with the size it had. A directory
    without a manifest (not written by this implementation), or one
    another writer saved into after it was published (`_rewritten_in_place`:
    HF accelerate saving to the same folder), is not checked here, since
    the manifest does not describe it; reading its files reports what is wrong.
    Catalog: save_state.roundtrip.
    """
    manifest_path = os.path.join(path, MANIFEST_NAME)
    if not os.path.isfile(manifest_path):
        return
    try:
        with open(manifest_path, encoding="utf-8") as stream:
            manifest = json.load(stream)
    except (OSError, ValueError) as error:
        raise CheckpointError(f"the manifest {manifest_path} cannot be read: {error}") from error
    if _rewritten_in_place(path, manifest["files"]):
        return
    if manifest["num_processes"] != num_processes:
        raise CheckpointError(
            f"{path} was saved by {manifest['num_processes']} processes and this run has {num_processes}: "
            "per-process states (random number generators, data positions) cannot be matched; resume with "
            f"{manifest['num_processes']} processes"
        )
    for name, size in manifest["files"].items():
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            raise CheckpointError(f"{file} is missing from the checkpoint {path}")
        found = os.path.getsize(file)
        if found != size:
            raise CheckpointError(f"{file} is damaged or truncated: {found} bytes, saved with {size}")
