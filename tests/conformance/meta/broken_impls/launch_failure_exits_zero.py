"""Broken: a launch whose rank raised exits 0.

Rule: a failing rank ends the launch with a non-zero exit. Caught at world 2 by ``launch.failure``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("commands.launch.multi_gpu_launcher")
RankFailure = ref.get("commands.launch.RankFailure")


def multi_gpu_launcher(args):
    try:
        original(args)
    except RankFailure:
        pass


ref.replace("commands.launch.multi_gpu_launcher", multi_gpu_launcher)
ref.export(globals())
