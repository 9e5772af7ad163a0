"""``accelerate-ref merge-weights``: one weights file from a sharded FSDP checkpoint (``merge_fsdp_weights``)."""

from __future__ import annotations

from .utils import CustomArgumentParser

description = """Utility to merge the weights from multiple FSDP checkpoints into a single combined checkpoint. Should be used if
`SHARDED_STATE_DICT` was used for the model. Weights will be saved to `{output_path}`.

This is a CPU-bound process and requires enough RAM to load the entire model state dict."""


def merge_command(args):
    """Merge ``args.checkpoint_directory`` into ``args.output_path`` (safetensors unless ``--unsafe_serialization``)."""
    from ..utils.fsdp_utils import merge_fsdp_weights  # torch.distributed.checkpoint: loaded only when merging

    merge_fsdp_weights(args.checkpoint_directory, args.output_path, not args.unsafe_serialization, args.remove_checkpoint_dir)


def merge_command_parser(subparsers=None):
    """The ``merge-weights`` parser: a subcommand of ``subparsers`` when given, else a parser of its own."""
    if subparsers is not None:
        parser = subparsers.add_parser("merge-weights", description=description, help="merge a sharded FSDP checkpoint")
    else:
        parser = CustomArgumentParser(description=description)
    parser.add_argument("checkpoint_directory", type=str, help="A directory containing sharded weights saved by FSDP.")
    parser.add_argument("output_path", type=str, help="The folder to save the merged weights in.")
    parser.add_argument("--unsafe_serialization", action="store_true", default=False, help="save `.bin` instead of `.safetensors`")
    parser.add_argument("--remove_checkpoint_dir", action="store_true", default=False, help="remove the checkpoint directory after merging")
    if subparsers is not None:
        parser.set_defaults(func=merge_command)
    return parser


def main():
    """``python -m accelerate_ref.commands.merge CHECKPOINT_DIR OUTPUT_PATH``."""
    merge_command(merge_command_parser().parse_args())


if __name__ == "__main__":
    main()
