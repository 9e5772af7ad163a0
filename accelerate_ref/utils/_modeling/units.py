"""Bytes: the file-size strings a memory budget or shard size may be written in, and the size of one element of a dtype.

Part of `accelerate_ref.utils.modeling` (re-exported there, where 🤗
Accelerate keeps these names).

Catalog: save_model.sharded, modeling.max_memory_strings, shard_checkpoint.doc_example.
"""

from __future__ import annotations

import re
from typing import Union

import torch

from .._dataclasses.low_precision import CustomDtype


#: The units `convert_file_size_to_int` reads, in the order it tries them: (suffix, bytes, a lower-case ``b`` means bits).
_SIZE_UNITS = (("GIB", 2**30, False), ("MIB", 2**20, False), ("KIB", 2**10, False),
               ("GB", 10**9, True), ("MB", 10**6, True), ("KB", 10**3, True))


def convert_file_size_to_int(size: Union[int, str]) -> int:
    """Bytes in ``size``: an int is returned as is; ``"5MB"`` is 5 * 10**6, ``"1GiB"`` 2**30.

    Rules (HF 1.15's): units GiB/MiB/KiB (binary) and GB/MB/KB (decimal),
    any case, after a number ``float`` reads (``"1e3MB"``, ``" 2MB"``); a
    decimal unit ending in a lower-case ``b`` (``"5Mb"``) means bits, divided
    by 8. A negative result, an unreadable number or another unit (``"5TB"``)
    is a ValueError quoting ``size``; a value that is neither an int nor a
    string fails as HF's does (``'float' object has no attribute 'upper'``).
    Catalog: save_model.sharded, modeling.max_memory_strings.
    """
    message = f"`size` {size} is not in a valid format. Use an integer for bytes, or a string with an unit (like '5.0GB')."
    value = -1
    try:
        if isinstance(size, int):
            value = size
        else:
            unit = next((unit for unit in _SIZE_UNITS if size.upper().endswith(unit[0])), None)
            if unit is not None:
                suffix, factor, bits = unit
                value = int(float(size[: -len(suffix)]) * factor)
                value = value // 8 if bits and size.endswith("b") else value
    except ValueError:
        raise ValueError(message) from None
    if value < 0:
        raise ValueError(message)
    return value


#: Bytes per element of the element types torch lacks.
_CUSTOM_DTYPE_BYTES = {CustomDtype.INT2: 1 / 4, CustomDtype.INT4: 1 / 2, CustomDtype.FP8: 1}
_FLOAT8_NAMES = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")


def dtype_byte_size(dtype: Union[torch.dtype, CustomDtype]) -> Union[int, float]:
    """Bytes one element of ``dtype`` takes: 1/8 for ``torch.bool``; for a `CustomDtype`
    (how bitsandbytes sizes quantized weights) 1/4 for INT2, 1/2 for INT4, 1 for FP8; 1 for torch's float8
    types; otherwise the trailing bit count of its name divided by 8 (HF's rule, so ``"float32"`` is 4 too), and
    a name without one is a ValueError. Catalog: shard_checkpoint.doc_example, quantization.load_and_quantize."""
    if dtype == torch.bool:
        return 1 / 8
    if isinstance(dtype, CustomDtype):
        return _CUSTOM_DTYPE_BYTES[dtype]
    if dtype in [getattr(torch, name) for name in _FLOAT8_NAMES if hasattr(torch, name)]:
        return 1
    bits = re.search(r"[^\d](\d+)$", str(dtype))
    if bits is None:
        raise ValueError(f"`dtype` is not a valid dtype: {dtype}.")
    return int(bits.groups()[0]) // 8
