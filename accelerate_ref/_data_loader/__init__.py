"""Pieces of `accelerate_ref.data_loader`: the adapter base, the epoch position and the samplers.

HF 1.15 keeps these in ``accelerate/data_loader.py``; they are public through
`accelerate_ref.data_loader` only.
"""
