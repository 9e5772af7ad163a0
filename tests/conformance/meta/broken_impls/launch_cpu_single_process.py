"""Broken: `launch --cpu --num_processes N` runs one process (accelerate issue #2741).

Rule: ``--cpu --num_processes N`` starts N gloo ranks. Caught at world 2 by
``launch.cpu_ranks`` (and at 2x2 by ``launch.multi_node``).
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("commands.launch.multi_gpu_launcher")
simple_launcher = ref.get("commands.launch.simple_launcher")


def multi_gpu_launcher(args):
    return simple_launcher(args) if args.cpu else original(args)


ref.replace("commands.launch.multi_gpu_launcher", multi_gpu_launcher)
ref.export(globals())
