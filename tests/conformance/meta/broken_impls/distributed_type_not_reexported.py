"""Broken: the top-level `DistributedType` is a second enum, not `utils.DistributedType`.

Rule: ``accelerate.DistributedType`` is ``accelerate.utils.DistributedType``
(a script comparing ``acc.distributed_type == accelerate.DistributedType.MULTI_CPU``
would silently get False). Caught at world 1 by ``enums.values``.
"""

import enum

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("utils.dataclasses.DistributedType")
DistributedType = enum.Enum("DistributedType", {member.name: member.value for member in original}, type=str)
ref.replace("DistributedType", DistributedType, everywhere=False)
ref.export(globals())
