"""``accelerate-ref estimate-memory``: what a model needs to load and to train, per dtype (🤗 Accelerate 1.15's command).

The model is built empty (on the meta device, catalog modeling.sizes) from its
config, never from weights: with ``transformers`` (``AutoConfig`` then the
``AutoModel`` class, or the first ``AutoModelFor*`` class of the config's
``auto_map``) or with ``timm`` (``create_model(..., pretrained=False)``).
``calculate_maximum_sizes`` gives its total size and its largest layer, each
divided by 2 for ``float16``, 4 for ``int8`` and 8 for ``int4``; the Adam
training column is 4x the float32 size for ``float32``, 2x for ``float16``,
and N/A for the integer dtypes. The table and every refusal (exception type
and text) are HF's.

The model is a Hub ID, looked up with ``huggingface_hub`` as HF does, or
(this module's addition) a local model folder or config file, read offline:
its ``config.json`` stands for the Hub's config metadata, and its library is
``--library_name``, else the model card's ``library_name``, else ``timm`` for
a timm config (an ``architecture`` key), else ``transformers``. HF 1.15 sends
every name to the Hub, so a local path fails there (``HFValidationError``).

``--training`` (also this module's addition) estimates each GPU's peak while
training on N GPUs instead: :mod:`accelerate_ref.commands.estimate_training`.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from typing import Any, Optional

import yaml

from ..utils import convert_bytes, is_timm_available, is_transformers_available
from .estimate_training import add_training_arguments, estimate_training
from .utils import CustomArgumentParser

#: dtype -> how many times smaller than float32 a parameter is.
DTYPE_DIVISORS = {"float32": 1, "float16": 2, "int8": 4, "int4": 8}

description = "Model size estimator for fitting a model onto device(e.g. cuda, xpu) memory."


@dataclass
class LocalModelInfo:
    """What ``create_empty_model`` reads from the Hub's model info, read from a local folder or config file."""

    library_name: Optional[str]
    config: Optional[dict]


def _model_card_library(folder: str) -> Optional[str]:
    """The ``library_name`` of the YAML header of ``folder``'s README.md (the Hub's library metadata), if any."""
    card = os.path.join(folder, "README.md")
    if not os.path.isfile(card):
        return None
    with open(card, encoding="utf-8") as handle:
        parts = handle.read().split("---", 2)
    if len(parts) < 3 or parts[0].strip():
        return None
    header = yaml.safe_load(parts[1])
    return header.get("library_name") if isinstance(header, dict) else None


def local_model_info(path: str) -> Optional[LocalModelInfo]:
    """The model info of a local model folder or config file; None when ``path`` is not on this machine."""
    if not os.path.exists(path):
        return None
    folder, config_file = (os.path.dirname(path), path) if os.path.isfile(path) else (path, os.path.join(path, "config.json"))
    config = None
    if os.path.isfile(config_file):
        with open(config_file, encoding="utf-8") as handle:
            config = json.load(handle)
    library = _model_card_library(folder)
    if library is None and config is not None:
        library = "timm" if "architecture" in config else "transformers"
    return LocalModelInfo(library_name=library, config=config)


def verify_on_hub(repo: str, token: Optional[str] = None):
    """The Hub's model info for ``repo``, else ``"gated"`` when it cannot be read (needs ``huggingface_hub``).

    Every Hub error is an OSError and reads as "gated": offline, gated, and, as in HF 1.15, a missing repository
    (HF's ``RepositoryNotFoundError`` branch after its OSError one is never reached). ``create_empty_model`` still
    words a ``"repo"`` answer as HF does.
    """
    try:
        from huggingface_hub import model_info
    except ImportError:
        raise ImportError(
            f"To look up `{repo}` on the Hub, `huggingface_hub` must be installed. Please install it via "
            "`pip install huggingface_hub`, or pass a local model folder."
        ) from None
    try:
        return model_info(repo, token=token)
    except OSError:
        return "gated"


def check_has_model(error: BaseException) -> str:
    """The library whose "no such model" ``error`` is: ``"timm"``, ``"transformers"`` or ``"unknown"``."""
    message = str(error)
    if is_timm_available():
        from huggingface_hub.utils import EntryNotFoundError  # timm depends on huggingface_hub

        if (
            (isinstance(error, RuntimeError) and "Unknown model" in message)
            or isinstance(error, EntryNotFoundError)
            or (isinstance(error, KeyError) and "architecture" in message)
        ):
            return "timm"
    if is_transformers_available() and isinstance(error, (OSError, ValueError)):
        if "does not appear to have a file named" in message or "Unrecognized model in" in message:
            return "transformers"
    return "unknown"


def add_timm_hub_prefix(model_name: str) -> str:
    """``model_name`` as ``timm.create_model`` takes it: a Hub repo ID (``org/name``) gains ``hf-hub:``; a bare
    architecture name or a name with a source prefix (``hf-hub:``, ``local-dir:``) is returned unchanged."""
    if ":" in model_name or "/" not in model_name:
        return model_name
    return f"hf-hub:{model_name}"


def _auto_model_class(transformers: Any, auto_map: Any) -> Any:
    """The first ``AutoModelFor*`` class a remote-code config's ``auto_map`` names, else ``AutoModel``."""
    if isinstance(auto_map, dict):
        for key in auto_map:
            if key.startswith("AutoModelFor"):
                return getattr(transformers, key)
    return transformers.AutoModel


def _empty_transformers_model(model_name: str, info: Any, trust_remote_code: bool, access_token: Optional[str]):
    if not is_transformers_available():
        raise ImportError(
            f"To check `{model_name}`, `transformers` must be installed. Please install it via `pip install transformers`"
        )
    print(f"Loading pretrained config for `{model_name}` from `transformers`...")
    if info.config is None:
        raise RuntimeError(f"Tried to load `{model_name}` with `transformers` but it does not have any metadata.")
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(model_name, trust_remote_code=trust_remote_code, token=access_token)
    from ..big_modeling import init_empty_weights  # not at CLI start-up (tests/accelerate_ref/test_lazy.py)

    with init_empty_weights():
        constructor = _auto_model_class(transformers, info.config.get("auto_map", False))
        # float32 explicitly: a config's own torch_dtype would change the sizes
        return constructor.from_config(config, torch_dtype=torch.float32, trust_remote_code=trust_remote_code)


def _empty_timm_model(model_name: str, info: Any):
    if not is_timm_available():
        raise ImportError(f"To check `{model_name}`, `timm` must be installed. Please install it via `pip install timm`")
    print(f"Loading pretrained config for `{model_name}` from `timm`...")
    import timm

    if isinstance(info, LocalModelInfo):
        folder = model_name if os.path.isdir(model_name) else os.path.dirname(model_name)
        name = f"local-dir:{folder}"
    else:
        name = add_timm_hub_prefix(model_name)
    from ..big_modeling import init_empty_weights  # not at CLI start-up (tests/accelerate_ref/test_lazy.py)

    with init_empty_weights():
        return timm.create_model(name, pretrained=False)


def create_empty_model(
    model_name: str, library_name: str, trust_remote_code: bool = False, access_token: Optional[str] = None
):
    """``model_name``'s model in float32 on the meta device, built by ``library_name`` (None: the library its
    metadata names). ``model_name`` is a Hub ID or a local model folder or config file; ``trust_remote_code`` lets
    transformers run the model's own code; ``access_token`` reads private or gated Hub repositories.

    Refusals (HF's): a gated or unreadable repository and a missing one are OSErrors, no library metadata and an
    unsupported library are ValueErrors, a missing library is an ImportError, a transformers model without a
    config a RuntimeError.
    """
    info = local_model_info(model_name) or verify_on_hub(model_name, access_token)
    if info == "gated":
        raise OSError(
            f"Repo for model `{model_name}` is gated. You must be authenticated to access it. Please run `huggingface-cli login`."
        )
    if info == "repo":
        raise OSError(
            f"Repo for model `{model_name}` does not exist on the Hub. If you are trying to access a private repo,"
            " make sure you are authenticated via `huggingface-cli login` and have access."
        )
    if library_name is None:
        library_name = getattr(info, "library_name", False)
        if not library_name:
            raise ValueError(
                f"Model `{model_name}` does not have any library metadata on the Hub, please manually pass in a "
                "`--library_name` to use (such as `transformers`)"
            )
    if library_name == "transformers":
        return _empty_transformers_model(model_name, info, trust_remote_code, access_token)
    if library_name == "timm":
        return _empty_timm_model(model_name, info)
    raise ValueError(f"Library `{library_name}` is not supported yet, please open an issue on GitHub for us to add support.")


def create_ascii_table(headers: list, rows: list, title: str) -> str:
    """``rows`` (lists of strings) under ``headers`` and a ``title`` line, in box-drawing characters, every cell
    centred. A title longer than the columns widens the last column by twice its overhang past the frame (HF 1.15's
    arithmetic, kept so the tables are identical)."""
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows)]
    if len(title) > sum(widths):
        widths[-1] += 2 * abs(len(title) - (sum(widths) + len(widths) + 1))
    inner = sum(widths) + len(widths) - 1

    def rule(left: str, joint: str, right: str) -> str:
        return left + joint.join("─" * width for width in widths) + right

    def line(cells: list) -> str:
        return "│" + "│".join(cell.center(width) for cell, width in zip(cells, widths)) + "│"

    lines = ["┌" + "─" * inner + "┐", "│" + title.center(inner) + "│", rule("├", "┬", "┤"), line(headers)]
    lines += [rule("├", "┼", "┤"), *(line(row) for row in rows), rule("└", "┴", "┘")]
    return "\n".join(lines)


def estimate_command_parser(subparsers=None):
    """The ``estimate-memory`` parser: a subcommand of ``subparsers`` when given, else a parser of its own."""
    if subparsers is not None:
        parser = subparsers.add_parser("estimate-memory", help="memory a model needs to load and train, per dtype")
    else:
        parser = CustomArgumentParser(description=description)
    parser.add_argument(
        "model_name", type=str, help="A model ID on the Hugging Face Hub, or a local model folder or config.json."
    )
    parser.add_argument(
        "--library_name",
        type=str,
        choices=["timm", "transformers"],
        help="The library that builds the model, when its metadata (Hub or model card) does not name one.",
    )
    parser.add_argument(
        "--dtypes",
        type=str,
        nargs="+",
        default=list(DTYPE_DIVISORS),
        choices=list(DTYPE_DIVISORS),
        help="The dtypes to estimate, one or more of `float32`, `float16`, `int8` and `int4`.",
    )
    parser.add_argument(
        "--trust_remote_code",
        action="store_true",
        default=False,
        help="Run the model's own modeling code (a custom model); only for code you trust and have read.",
    )
    add_training_arguments(parser)
    if subparsers is not None:
        parser.set_defaults(func=estimate_command)
    return parser


def estimate_training_usage(bytes: int, mixed_precision: str, msamp_config: Optional[str] = None) -> dict:
    """The memory a training step with Adam at batch size 1 needs, by part (``model``, ``optimizer``, ``gradients``,
    ``step``), for a model of ``bytes`` in float32 trained in ``mixed_precision``; -1 for a part it cannot tell.

    float32: model 1x, gradients 1x, optimizer 2x, step 4x. float16, bfloat16, and fp8 without an MS-AMP config
    (no saving with TransformerEngine): model 1x, gradients 1.5x, optimizer and step 2x. Anything else: all -1.
    """
    sizes = {"model": -1, "optimizer": -1, "gradients": -1, "step": -1}
    if mixed_precision == "float32":
        sizes.update(model=bytes, gradients=bytes, optimizer=bytes * 2, step=bytes * 4)
    elif mixed_precision in ("float16", "bfloat16") or (mixed_precision == "fp8" and msamp_config is None):
        sizes.update(model=bytes, gradients=bytes + bytes // 2, optimizer=bytes * 2, step=bytes * 2)
    return sizes


def _scaled(size: int, dtype: str):
    divisor = DTYPE_DIVISORS.get(dtype, 1)
    return size / divisor if divisor > 1 else size


def gather_data(args: argparse.Namespace) -> list:
    """One row per ``args.dtypes``: ``[dtype, largest layer bytes, total bytes, training usage by part]``.

    A model the library cannot find is a RuntimeError naming the library; other errors pass through.
    """
    try:
        model = create_empty_model(args.model_name, library_name=args.library_name, trust_remote_code=args.trust_remote_code)
    except (RuntimeError, OSError, ValueError, KeyError) as error:
        library = check_has_model(error)
        if library != "unknown":
            raise RuntimeError(
                f"Tried to load `{args.model_name}` with `{library}` but a possible model to load was not found inside the repo."
            )
        raise
    from ..utils.modeling import calculate_maximum_sizes  # not at CLI start-up

    total_size, (largest_layer, _) = calculate_maximum_sizes(model)
    return [
        [dtype, _scaled(largest_layer, dtype), _scaled(total_size, dtype), estimate_training_usage(total_size, dtype)]
        for dtype in args.dtypes
    ]


def _cell(item: Any) -> Any:
    if isinstance(item, (int, float)):
        return convert_bytes(item)
    if isinstance(item, dict):
        peak = max(item.values())
        return convert_bytes(peak) if peak != -1 else "N/A"
    return item


def estimate_command(args: argparse.Namespace) -> Optional[int]:
    """Print the memory table of ``args.model_name`` (sizes in the largest unit under 1024, ``convert_bytes``); with
    ``--training``, the per-rank training table instead (:mod:`.estimate_training`) and its exit status."""
    if getattr(args, "training", False):
        return estimate_training(args)
    rows = [[_cell(item) for item in row] for row in gather_data(args)]
    headers = ["dtype", "Largest Layer", "Total Size", "Training using Adam"]
    print(create_ascii_table(headers, rows, f"Memory Usage for loading `{args.model_name}`"))


def main():
    """``python -m accelerate_ref.commands.estimate MODEL [--library_name ...] [--dtypes ...]``."""
    estimate_command(estimate_command_parser().parse_args())


if __name__ == "__main__":
    main()
