"""``python -m tests.simulators.process_probe CODE [SLEEP_S]``: prints, as one JSON line, what a process can observe
of how it was started, then exits with CODE (after sleeping SLEEP_S seconds). With ``PROBE_CUDA`` set, also what
``torch.cuda`` and torch._dynamo's CUDA device interface (which captures ``torch.cuda``'s functions when it is
imported) report, after allocating on the GPU. Holds no tests."""
import json
import os
import sys
import tempfile

import numpy
import torch


def observed() -> dict:
    return {
        "argv": sys.argv[1:],
        "path": sys.path,
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "streams": [(type(stream.buffer).__name__, stream.line_buffering, stream.write_through, stream.encoding,
                     stream.errors) for stream in (sys.stdin, sys.stdout, sys.stderr)],
        "tempdir": tempfile.gettempdir(),
        "numpy_draw": float(numpy.random.random()),
        "torch_threads": torch.get_num_threads(),
        "session_leader": os.getsid(0) == os.getpid(),
        "parent": os.getppid(),
        "cuda": _cuda() if os.environ.get("PROBE_CUDA") else None,
    }


def _cuda() -> dict:
    from torch._dynamo.device_interface import get_interface_for_device

    dynamo = get_interface_for_device("cuda")
    if torch.cuda.is_available():  # an allocation for the memory books, where the launch asked for reports
        torch.zeros(256, device="cuda")
    return {"available": torch.cuda.is_available(), "devices": torch.cuda.device_count(),
            "dynamo_available": dynamo.is_available(), "dynamo_devices": dynamo.device_count()}


if __name__ == "__main__":
    print(json.dumps(observed()))
    print("to stderr", file=sys.stderr)
    if len(sys.argv) > 2:
        import time

        time.sleep(float(sys.argv[2]))
    sys.exit(int(sys.argv[1]))
