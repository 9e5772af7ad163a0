"""Broken: `LoggerType.COMETML` has the value "cometml" instead of the documented "comet_ml".

Rule: enum members have the documented values (the strings users pass to
``log_with``). Caught at world 1 by ``enums.values``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
dataclasses = ref.module("utils.dataclasses")
original = dataclasses.LoggerType
LoggerType = dataclasses.BaseEnum(
    "LoggerType",
    [(member.name, "cometml" if member.name == "COMETML" else member.value) for member in original],
    module=dataclasses.__name__,
)
ref.replace("utils.dataclasses.LoggerType", LoggerType)
ref.export(globals())
