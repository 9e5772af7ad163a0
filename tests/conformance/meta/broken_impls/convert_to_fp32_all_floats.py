"""Broken: `convert_to_fp32` converts every floating leaf, fp64 included, to fp32.

Rule: fp16/bf16 leaves become fp32; other leaves are untouched. Caught at
world 1 by ``ops.convert_to_fp32``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
recursively_apply = ref.get("utils._operations.structures.recursively_apply")


def convert_to_fp32(tensor):
    return recursively_apply(
        lambda leaf: leaf.float(), tensor, test_type=lambda leaf: getattr(leaf, "is_floating_point", lambda: False)()
    )


ref.replace("utils._operations.structures.convert_to_fp32", convert_to_fp32)
ref.export(globals())
