"""What the ``config`` subcommands share: the dynamo backends offered and the help formatter."""

from __future__ import annotations

import argparse

#: The torch.compile backends ``accelerate config`` offers (🤗 Accelerate 1.15's list, spelling kept).
DYNAMO_BACKENDS = [
    "EAGER", "AOT_EAGER", "INDUCTOR", "AOT_TS_NVFUSER", "NVPRIMS_NVFUSER", "CUDAGRAPHS", "OFI", "FX2TRT",
    "ONNXRT", "TENSORRT", "AOT_TORCHXLA_TRACE_ONCE", "TORHCHXLA_TRACE_ONCE", "TVM",
]


class SubcommandHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """A help formatter whose usage line leaves out the top-level ``<command> [<args>]``."""

    def _format_usage(self, usage, actions, groups, prefix):
        return super()._format_usage(usage, actions, groups, prefix).replace("<command> [<args>] ", "")
