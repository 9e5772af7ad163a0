"""Pieces of `accelerate_ref.utils.operations`: nested structures, sample batches, and the collective backends.

HF 1.15 keeps the structure helpers in ``accelerate/utils/operations.py``; they
are public through `accelerate_ref.utils.operations` and `accelerate_ref.utils` only.
"""
