"""Broken: the device mesh lays its dimensions out in the constructor's order (tp before cp), not HF's mesh order.

Rule: `ParallelismConfig` builds its mesh over the enabled dimensions in the order dp_replicate, dp_shard, cp, sp,
tp, as HF 1.15 does (its dimension names, and so which ranks share each dimension). Every size and property stays
as it was, so only the mesh's names and rank layout show it. Caught by the differential harness
(`tests/conformance/tools/test_differential.py`).
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
ref.replace("parallelism_config.MESH_ORDER", ref.get("parallelism_config.DIMENSIONS"))
ref.export(globals())
