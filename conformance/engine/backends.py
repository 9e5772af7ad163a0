"""Where the ranks of a run come from.

* ``sim``: the simulator's persistent rank pool on this host (gloo on
  loopback). Cases run in lock-step on every rank; outcomes return over the
  pool's control channel; a HANG or CRASH rebuilds the pool and the run goes
  on.
* ``sim-xla`` / ``sim-npu``: the same pool on the simulator's mock XLA (TPU)
  or NPU (Ascend) device: every rank finds the stand-in ``torch_xla`` /
  ``torch_npu`` first on its import path (:mod:`simulators.devices`).
* ``native``: the suite runs inside ranks that torchrun / ``accelerate
  launch`` already started (a real GPU or TPU runner): :mod:`.native`.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from typing import Any, Callable

from simulators.devices import world_settings
from simulators.forking import KeptZygote
from simulators.launcher import RUN_PRELOAD
from simulators.outcome import RankOutcome
from simulators.pool import PoolResult, PoolStartError, RankPool
from simulators.spawn import describe_exit
from simulators.topology import World

from .case import Case, WorldInfo
from .merge import merge_incomplete, merge_replies, result
from .native import NativeBackend
from .results import CaseResult, Emit, Status

#: Seconds of case timeout added per rank beyond 8: gloo's full-mesh rendezvous in a case's first
#: ``init_process_group`` grows with the world (about 15 s for 64 ranks on 2 cores).
RENDEZVOUS_S_PER_RANK = 0.5
#: A HANG's second run, alone in fresh ranks, gets this many times the case's timeout.
CONFIRM_TIMEOUT_FACTOR = 2.0
#: What the fork server of a backend's ranks imports besides the worker, the implementation (and its ``Accelerator``,
#: which a package may load lazily) and the modules the run's cases declare (:attr:`.case.Case.imports`): what
#: every rank of :func:`simulators.launcher.run` reaches, and torch.distributed.
RANK_PRELOAD = (*RUN_PRELOAD, "torch.distributed")


class SimBackend:
    """Ranks from the simulator's rank pool.

    One world is live at a time: asking for a case at another world closes
    the pool of the previous one. Every world's ranks are forked from one fork
    server, which imported :data:`RANK_PRELOAD`, the implementation and what the
    cases declare they import (:meth:`expect`). After a case whose ranks did not all end
    the same way, the pool is rebuilt: a rank that stopped early may have
    left collectives unmatched in the process group.
    """

    name = "sim"
    #: Environment every rank of this backend gets. HF accelerate needs
    #: ``ACCELERATE_USE_CPU`` to see MULTI_CPU under a torchrun-style launch.
    base_env: dict[str, str] = {"ACCELERATE_USE_CPU": "1"}
    #: The simulator's mock device family the ranks run on (None: CPU).
    device: str | None = None

    def __init__(
        self,
        impl: str,
        case_timeout: float,
        start_timeout: float = 180.0,
        env: dict[str, str] | None = None,
        machine: dict[str, str] | None = None,
    ) -> None:
        """``env``: added for every rank (``--debug-collectives``); ``machine``: the mock accelerators'
        environment (:func:`simulators.devices.families.machine.machine_env`)."""
        if machine and self.device is None:
            raise ValueError(f"backend {self.name} has no mock accelerators; --device-count and --device-memory "
                             "need sim-npu or sim-xla")
        self.machine = dict(machine or {})
        self.impl = impl
        #: Environment added for every rank (``--debug-collectives``), over ``base_env``.
        self.env = dict(env or {})
        self.case_timeout = case_timeout
        self.start_timeout = start_timeout
        self._pools: dict[World, RankPool] = {}
        #: Whether a HANG result is confirmed by a second run (the runner declines for hangs a manifest expects).
        self.confirm_hang: Callable[[CaseResult], bool] = lambda hung: True
        self._scratch = tempfile.TemporaryDirectory(prefix="conformance-")
        self._fork_server: KeptZygote | None = None
        #: Modules the cases to run declare they import (:meth:`expect`), for the fork server.
        self._imports: dict[str, None] = {}

    def worlds_supported(self, world: World) -> bool:
        return True

    def expect(self, cases: list[Case]) -> None:
        """Have the fork server import what ``cases`` declare they import (:attr:`.case.Case.imports`), once for
        every world's ranks; a server already started with less is replaced at the next world."""
        self._imports.update(dict.fromkeys(module for case in cases for module in case.imports))

    @property
    def fork_server_pid(self) -> int | None:
        """The process id of the fork server the ranks come from (None before the first world and after close)."""
        return self._fork_server.pid if self._fork_server is not None else None

    def runs(self, case: Case) -> bool:
        """Whether ``case`` applies here: a case about one device family runs on that family's mock only."""
        return case.device in (None, self.device)

    def run_world(self, world: World, cases: list[Case], emit: Emit) -> None:
        """Run ``cases`` at ``world``, emitting one result per case as it ends."""
        try:
            for case in cases:
                emit(self.run_case(case, world))
        finally:
            self.close_pools()

    def run_case(self, case: Case, world: World) -> CaseResult:
        """Run one case on every rank of ``world`` and merge the outcome; a HANG is confirmed before it is reported.

        A case that is slow is not a hang (a long-lived rank collecting garbage, a machine half as fast as on
        other days): after a HANG that ``confirm_hang`` asks to confirm, the same case runs alone in fresh ranks
        with CONFIRM_TIMEOUT_FACTOR times its timeout. A second HANG is reported as confirmed; any other ending
        is reported instead, its message saying the first try was slow, not hung.
        """
        timeout = case.timeout_within(self.case_timeout)
        first = self._run_once(case, world, timeout)
        if first.status is not Status.HANG or not self.confirm_hang(first):
            return first
        self.close_pools()
        longer = timeout * CONFIRM_TIMEOUT_FACTOR
        again = self._run_once(case, world, longer)
        if again.status is Status.HANG:
            again.message = f"HANG confirmed: it hung again alone in fresh ranks, given {longer:g} s\n{again.message}"
        else:
            again.message = (f"slow, not hung: past its {timeout:g} s timeout in the "
                             f"run's ranks, it ended {again.status.value} alone in fresh ranks in "
                             f"{again.duration_s:.1f} s (given {longer:g} s)\n{again.message}").rstrip()
        again.duration_s = round(first.duration_s + again.duration_s, 4)
        return again

    def _run_once(self, case: Case, world: World, timeout: float) -> CaseResult:
        """Run ``case`` once on every rank of ``world`` with ``timeout`` seconds (plus rendezvous time)."""
        pool = self._pool(world)
        shared_dir = tempfile.mkdtemp(prefix=f"{case.name}-", dir=self._scratch.name)
        info = WorldInfo(world, shared_dir)
        started = time.perf_counter()
        try:
            outcome = pool.run(
                "conformance.engine.worker:run_case",
                (case.key, world.label, shared_dir),
                timeout + RENDEZVOUS_S_PER_RANK * max(0, world.size - 8),
                failed=_rank_failed,
            )
        except PoolStartError as error:
            message = f"the ranks of world {world.label} did not start:\n{error}"
            return result(case, info, self.name, self.impl, Status.ERROR, message, time.perf_counter() - started, {})
        finally:
            shutil.rmtree(shared_dir, ignore_errors=True)
        replies = _replies(outcome)
        if outcome.status == "ok":
            status, message = merge_replies(case, info, replies)
            if len({reply["status"] for reply in replies.values()}) > 1:
                pool.close()
        else:
            cause = Status.HANG if outcome.status == "hang" else Status.CRASH
            missing = sorted(set(range(world.size)) - set(replies))
            status, message = merge_incomplete(replies, missing, cause, _incident(outcome))
        case_result = result(
            case, info, self.name, self.impl, status, message, time.perf_counter() - started, replies, outcome.stacks,
            output=outcome.output_tail,
        )
        if outcome.collectives is not None:
            case_result.collectives = outcome.collectives.to_json()
        return case_result

    def _pool(self, world: World) -> RankPool:
        if world not in self._pools:
            self.close_pools()
            preload = [*RANK_PRELOAD, *self._imports, "conformance.engine.worker", self.impl, f"{self.impl}:Accelerator"]
            if self._fork_server is None or self._fork_server.preload != tuple(preload):
                self._close_fork_server()
                self._fork_server = KeptZygote(preload)
            devices = world_settings(self.device) if self.device else None
            self._pools[world] = RankPool(
                world,
                setup="conformance.engine.worker:setup",
                env={**(devices.env if devices else {}), **self.machine, **self.base_env, **self.env,
                     "ACCELERATE_IMPL": self.impl},
                start_timeout=self.start_timeout,
                pythonpath=[*(devices.pythonpath if devices else ()), *sys.path],
                fork_server=self._fork_server,
            )
        return self._pools[world]

    def close_pools(self) -> None:
        """Close the pool of every world."""
        while self._pools:
            self._pools.popitem()[1].close()

    def close(self) -> None:
        self.close_pools()
        self._close_fork_server()
        self._scratch.cleanup()

    def _close_fork_server(self) -> None:
        if self._fork_server is not None:
            self._fork_server.close()
            self._fork_server = None


class SimXlaBackend(SimBackend):
    """The rank pool on the mock XLA device: HF accelerate and the reference see ``DistributedType.XLA``."""

    name = "sim-xla"
    base_env: dict[str, str] = {}
    device = "xla"


class SimNpuBackend(SimBackend):
    """The rank pool on the mock NPU device: ``MULTI_NPU`` over ``hccl`` (gloo underneath).

    No ``ACCELERATE_USE_CPU`` here: HF accelerate would then choose the CPU over the NPU.
    """

    name = "sim-npu"
    base_env: dict[str, str] = {}
    device = "npu"


def _rank_failed(outcome: RankOutcome) -> bool:
    """Whether a rank's reply fails the case (the others then get the pool's grace, not the case's timeout)."""
    return not outcome.ok or Status(outcome.value["status"]).is_problem


def _replies(outcome: PoolResult) -> dict[int, dict[str, Any]]:
    """The per-rank replies of ranks whose worker answered."""
    replies = {}
    for rank, rank_outcome in outcome.outcomes.items():
        if rank_outcome.ok:
            replies[rank] = rank_outcome.value
        else:
            replies[rank] = {"status": Status.ERROR.value, "message": f"rank {rank}: {rank_outcome.error}"}
    return replies


def _incident(outcome: PoolResult) -> str:
    """A readable account of a hang or crash: exit codes, the collectives ranks were in, stacks (each rank's
    output is the result's ``output``)."""
    lines = []
    for rank, code in sorted(outcome.exit_codes.items()):
        lines.append(f"rank {rank} {describe_exit(code)}")
    if outcome.collectives is not None and outcome.collectives.groups:
        lines.append(outcome.collectives.text())
    for rank, stack in sorted(outcome.stacks.items()):
        lines.append(f"rank {rank} stack:\n{stack.rstrip()}")
    return "\n".join(lines)


_SIMULATED = {backend.name: backend for backend in (SimBackend, SimXlaBackend, SimNpuBackend)}


def make_backend(
    name: str, impl: str, case_timeout: float, *, env: dict[str, str] | None = None,
    machine: dict[str, str] | None = None,
) -> SimBackend | NativeBackend:
    """The backend called ``name``; ``env`` is added to the ranks' environment where the backend starts
    them; ``machine`` sets its mock accelerators up (ValueError where it has none)."""
    if name in _SIMULATED:
        return _SIMULATED[name](impl, case_timeout, env=env, machine=machine)
    if name == "native":
        if machine:
            raise ValueError("backend native runs on real devices; --device-count and --device-memory "
                             "need sim-npu or sim-xla")
        return NativeBackend(impl, case_timeout)
    raise ValueError(f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)}")


def mock_device(name: str) -> str | None:
    """The mock accelerator family backend ``name`` runs on (``"npu"``, ``"xla"``), None for none."""
    backend = _SIMULATED.get(name)
    return backend.device if backend else None


BACKENDS = (*_SIMULATED, "native")
