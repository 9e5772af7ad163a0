"""Broken: regional compilation of an FSDP2-sharded model wraps each block in a `torch.compile` module.

Rule: under FSDP2 the blocks are compiled in place (``compile_regions_fsdp2``), so the
hooks ``fully_shard`` registered stay on each module's call path. Caught by
``plugin.dynamo`` (``plugin_dynamo_regional_fsdp``).
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("_accelerator.engines.compile_model")


def compile_model(model, plugin):
    if plugin.use_regional_compilation and str(plugin.backend).upper() != "NO":
        return ref.module("utils.other").compile_regions(model, **plugin.to_kwargs())
    return original(model, plugin)


ref.replace("_accelerator.engines.compile_model", compile_model)
ref.export(globals())
