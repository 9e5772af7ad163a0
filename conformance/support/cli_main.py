"""``python -m conformance.support.cli_main IMPL ROOT ARGS...``: an implementation's ``accelerate`` command.

Imports the implementation ``IMPL`` (a module exporting ``Accelerator``), then runs ``ROOT.commands.accelerate_cli``'s
``main()`` with ``ARGS`` as ``accelerate ARGS`` would, and exits with its status. ``ROOT`` is the top package that
holds the commands (:func:`.launching.cli_root`). The launch cases fork it from their fork server.
"""

from __future__ import annotations

import importlib
import sys


def main() -> int:
    impl, root, *args = sys.argv[1:]
    importlib.import_module(impl).Accelerator
    cli = importlib.import_module(f"{root}.commands.accelerate_cli")
    sys.argv = ["accelerate", *args]
    return cli.main()


if __name__ == "__main__":
    sys.exit(main())
