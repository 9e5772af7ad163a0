"""Pieces of `accelerate_ref.utils.dataclasses`: the engine plugins and the low-precision recipes.

HF 1.15 keeps them in ``accelerate/utils/dataclasses.py``; they are public
through `accelerate_ref.utils.dataclasses` and `accelerate_ref.utils` only.
"""
