"""Pieces of `accelerate_ref.accelerator`: the mixins `Accelerator` is built from and the engines it drives.

HF 1.15 keeps all of this in ``accelerate/accelerator.py``; here each concern has
its own module, and only `accelerate_ref.accelerator` is a public import path.
"""
