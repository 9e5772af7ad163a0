"""The script of case ``state.clean_exit``: a few lines of Accelerator use that return normally.

The case starts it under ``torch.distributed.run`` and expects every rank to
exit with status 0. Two things make a latent abort at interpreter exit show
up here rather than once in a while on a loaded machine:

* the main thread keeps the GIL until it blocks (a long switch interval),
  and a module-level object's finalizer waits while Python is finalizing
  (as one that flushes a file or a socket does), so a background thread that
  needs the GIL late meets a finalizing interpreter;
* a callback registered before the implementation is imported, and so run
  after every ``atexit`` callback of the implementation, records whether the
  default process group is still up when the interpreter is about to
  finalize. A group left up then keeps gloo's worker threads alive into
  finalization, where a worker that drops the last reference to a finished
  collective's tensors needs the GIL and aborts the rank (SIGABRT,
  "terminate called without an active exception").

Each rank writes what it saw to ``$CONFORMANCE_EXIT_REPORT/rank<N>.json``.
"""

import atexit
import importlib
import json
import os
import sys
import time

facts = {"returned": False}


def _record_at_exit() -> None:
    import torch.distributed as dist

    facts["group_up_at_exit"] = bool(dist.is_available() and dist.is_initialized())
    report = os.path.join(os.environ["CONFORMANCE_EXIT_REPORT"], f"rank{os.environ['RANK']}.json")
    with open(report, "w", encoding="utf-8") as stream:
        json.dump(facts, stream)


atexit.register(_record_at_exit)


class _SlowFinalizer:
    def __del__(self) -> None:
        time.sleep(0.5)


_finalizer = _SlowFinalizer()
sys.setswitchinterval(1000)

import torch  # noqa: E402

impl = importlib.import_module(os.environ["CONFORMANCE_EXIT_IMPL"])
accelerator = impl.Accelerator()
gathered = accelerator.gather(torch.tensor([accelerator.process_index], device=accelerator.device))
facts.update(returned=True, process_index=accelerator.process_index, gathered=gathered.cpu().tolist())
