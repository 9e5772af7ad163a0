"""Pieces of `accelerate_ref.utils.other`: crash-safe saving and loading, and ports.

HF 1.15 keeps them in ``accelerate/utils/other.py``; they are public through
`accelerate_ref.utils.other` and `accelerate_ref.utils` only.
"""
