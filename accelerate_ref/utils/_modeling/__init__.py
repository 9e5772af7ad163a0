"""Pieces of `accelerate_ref.utils.modeling`: module sizes and memory budgets, and device maps.

HF 1.15 keeps them in ``accelerate/utils/modeling.py``; they are public through
`accelerate_ref.utils.modeling` and `accelerate_ref.utils` only.
"""
