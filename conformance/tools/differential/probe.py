"""Probes: small functions that exercise one public behaviour, and what they see of an implementation.

A probe module under :mod:`conformance.tools.differential.probes` registers its
probes with :func:`probe`::

    @probe("utils.operations", worlds=(1, 2))
    def gather_a_rank_tensor(api):
        api.get("PartialState")()
        api.call("gather", "utils.operations.gather", torch.tensor([api.rank]))
        api.call("gather of a string", "utils.operations.gather", "x")

Rules:

* a probe reaches the implementation only through ``api``: ``api.get`` looks
  a public path up (``"utils.operations.gather"``, ``"Accelerator"``),
  ``api.call``/``api.observe`` run one call and record what it did under a
  label, ``api.record`` records a value; a probe goes on after a call that
  raised, so one probe can try a valid call and every refusal in turn;
* what the probe returns or raises is recorded too (label ``probe``), and so
  are the files it left in ``api.tmp``, its working directory (label ``files``);
  an exception raised by the probe's own code (a line of its module, not of
  the implementation: a misspelt name, say) is also recorded as
  ``probe code raised``, which the runner reports when it happens under the
  reference, so that a probe cannot agree with itself by failing twice;
* each run starts from fresh implementation state (the ``_reset_state``
  hooks), seeds 0 for ``random``, numpy and torch, and the probe's ``env``;
  the environment, working directory and state are restored after it;
* ``worlds`` and ``families`` say where it runs: world 1 on the CPU runs in
  the driver's process; world 2, and the ``"cuda"`` family (the simulator's
  mock CUDA GPUs, where HF takes its GPU paths), run on simulated ranks.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import pkgutil
import random
import shutil
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import torch

from ...engine.impl import Implementation
from .files import describe_files
from .observe import ClassIndex, Normaliser, observe

Observations = list[tuple[str, dict[str, Any]]]
FAMILIES = ("cpu", "cuda")


@dataclass(frozen=True)
class Probe:
    """One registered probe: ``name`` is ``<area>.<function name>``."""

    name: str
    area: str
    function: Callable[["Api"], Any]
    worlds: tuple[int, ...] = (1,)
    families: tuple[str, ...] = ("cpu",)
    env: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 60.0

    def settings(self) -> list[str]:
        """Where this probe runs, as ``family/world`` labels (``"cpu/1"``, ``"cuda/2"``)."""
        return [f"{family}/{world}" for family in self.families for world in self.worlds]


_REGISTRY: dict[str, Probe] = {}


def probe(area: str, *, worlds: tuple[int, ...] = (1,), families: tuple[str, ...] = ("cpu",),
          env: Mapping[str, str] | None = None, timeout: float = 60.0) -> Callable:
    """Register the decorated function as the probe ``<area>.<name>``; see the module docstring."""
    unknown = set(families) - set(FAMILIES)
    if unknown or not families:
        raise ValueError(f"probe families must be among {FAMILIES}, got {families}")

    def register(function: Callable[[Api], Any]) -> Callable[[Api], Any]:
        name = f"{area}.{function.__name__}"
        if name in _REGISTRY:
            raise ValueError(f"two probes are called {name}")
        _REGISTRY[name] = Probe(name, area, function, tuple(worlds), tuple(families), dict(env or {}), timeout)
        return function

    return register


def all_probes() -> list[Probe]:
    """Every probe of every module under :mod:`conformance.tools.differential.probes`, by name."""
    from . import probes as package

    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{module.name}")
    return sorted(_REGISTRY.values(), key=lambda found: found.name)


def find(name: str) -> Probe:
    if name not in _REGISTRY:
        all_probes()
    return _REGISTRY[name]


class Subject:
    """An implementation as the harness sees it: imported, its package names read as ``reads_as``."""

    def __init__(self, name: str, reads_as: str, classes: ClassIndex) -> None:
        self.impl = Implementation.load(name)
        accelerator = getattr(self.impl.module, "Accelerator", None)
        roots = {name, accelerator.__module__.split(".")[0]} if accelerator is not None else {name}
        self.names = {root: reads_as for root in roots}
        #: the implementation's loggers are children of its package roots' loggers
        self.loggers = sorted(roots)
        self.classes = classes.resolve(self.get, key=name)

    def get(self, dotted: str) -> Any:
        """The object at public path ``dotted`` of the implementation, importing submodules on the way."""
        head, *rest = dotted.split(".")
        found = self.impl.part(head)
        for part in rest:
            try:
                found = getattr(found, part)
            except AttributeError:
                if not isinstance(found, ModuleType):
                    raise
                found = importlib.import_module(f"{found.__name__}.{part}")
        return found

    def reset(self) -> None:
        """Forget every singleton state (accelerator, process, gradient), keeping the process group."""
        state = self.impl.part("state")
        for singleton in ("AcceleratorState", "GradientState", "PartialState"):
            reset = getattr(getattr(state, singleton, None), "_reset_state", None)
            if reset is not None:
                reset(True) if singleton == "AcceleratorState" else reset()


class Api:
    """What a probe is given: the implementation's public paths and a recorder of what calls did."""

    def __init__(self, subject: Subject, normaliser: Normaliser, tmp: Path, rank: int, world_size: int,
                 family: str) -> None:
        self._subject = subject
        self._normaliser = normaliser
        self.tmp = tmp
        self.rank = rank
        self.world_size = world_size
        #: ``"cpu"`` or ``"cuda"`` (the simulator's mock GPUs)
        self.family = family
        self.observations: Observations = []

    @property
    def module(self) -> ModuleType:
        """The implementation's top-level module (``accelerate`` or ``accelerate_ref``)."""
        return self._subject.impl.module

    def get(self, dotted: str) -> Any:
        return self._subject.get(dotted)

    @contextlib.contextmanager
    def logs_at(self, level: int, module: str = "") -> Iterator[None]:
        """The implementation's logger of ``module`` (``"utils.modeling"``; its whole package for ``""``) at ``level``
        for the ``with``, its level restored after: records below WARNING are observed only inside one."""
        logger = logging.getLogger(".".join(filter(None, (self.module.__name__, module))))
        before = logger.level
        logger.setLevel(level)
        try:
            yield
        finally:
            logger.setLevel(before)

    def accelerator(self, **kwargs: Any) -> Any:
        """An ``Accelerator(**kwargs)``; on the CPU family with ``cpu=True`` unless given (HF needs it to see the
        ranks of a CPU world as MULTI_CPU)."""
        if self.family == "cpu":
            kwargs.setdefault("cpu", True)
        return self.get("Accelerator")(**kwargs)

    def partial_state(self, **kwargs: Any) -> Any:
        """A ``PartialState(**kwargs)``, with ``cpu=True`` on the CPU family as :meth:`accelerator`."""
        if self.family == "cpu":
            kwargs.setdefault("cpu", True)
        return self.get("PartialState")(**kwargs)

    def observe(self, label: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call ``function``, record what it did under ``label`` and return its value (None if it raised)."""
        observation, value = observe(self._normaliser, self._subject.loggers, function, *args, **kwargs)
        self._add(label, observation)
        return value

    def call(self, label: str, dotted: str, *args: Any, **kwargs: Any) -> Any:
        """:meth:`observe` the implementation's ``dotted`` (a lookup that fails is recorded as what it raised)."""
        return self.observe(label, lambda: self.get(dotted)(*args, **kwargs))

    def record(self, label: str, value: Any) -> None:
        """Record ``value`` as seen, under ``label``."""
        self._add(label, {"value": self._normaliser.value(value)})

    def _add(self, label: str, observation: dict[str, Any]) -> None:
        taken = {existing for existing, _ in self.observations}
        unique, count = label, 1
        while unique in taken:
            count += 1
            unique = f"{label} #{count}"
        self.observations.append((unique, observation))


def seed_everything(seed: int = 0) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


#: The label of an exception raised by a probe's own code (see the module rules).
PROBE_CODE_RAISED = "probe code raised"


def _failing_in_own_code(found: Probe, failures: list[str]) -> Callable[[Api], Any]:
    """``found``'s function, noting in ``failures`` an exception whose innermost frame is in the probes' folder."""
    folder = Path(found.function.__code__.co_filename).resolve().parent

    def body(api: Api) -> Any:
        try:
            return found.function(api)
        except Exception as error:
            where = traceback.extract_tb(error.__traceback__)[-1]
            if Path(where.filename).resolve().parent == folder:
                failures.append(f"{type(error).__name__}: {error} ({Path(where.filename).name}:{where.lineno})")
            raise

    return body


def run_probe(found: Probe, subject: Subject, *, tmp: Path | None = None, rank: int = 0, world_size: int = 1,
              family: str = "cpu", settle: Callable[[], None] = lambda: None) -> Observations:
    """Run ``found`` once under ``subject`` and return what it saw; see the module docstring for the rules.

    ``tmp``: the folder the ranks of a world share (created and removed by the caller); a fresh one by default.
    ``settle``: called on every rank once the probe returned, before rank 0 reads the files (a barrier, so
    that it reads every rank's).
    """
    own_tmp = tmp is None
    folder = Path(tempfile.mkdtemp(prefix="differential-")) if own_tmp else tmp
    normaliser = Normaliser(subject.names, subject.classes, {str(folder), str(folder.resolve())})
    api = Api(subject, normaliser, folder, rank, world_size, family)
    saved_env, cwd = dict(os.environ), os.getcwd()
    subject.reset()
    seed_everything()
    os.environ.update(found.env)
    os.chdir(folder)
    own_failures: list[str] = []
    try:
        top, _ = observe(normaliser, subject.loggers, _failing_in_own_code(found, own_failures), api)
        if top != {"value": None}:
            api.observations.append(("probe", top))
        if own_failures:
            api.observations.append((PROBE_CODE_RAISED, {"value": own_failures[0]}))
        settle()
        if rank == 0:
            files = describe_files(folder, normaliser)
            if files:
                api.observations.append(("files", {"value": files}))
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        subject.reset()
        if own_tmp:
            shutil.rmtree(folder, ignore_errors=True)
    return api.observations
