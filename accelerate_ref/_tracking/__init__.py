"""Pieces of `accelerate_ref.tracking`: what every tracker shares, and the trackers of other packages.

HF 1.15 keeps every tracker in ``accelerate/tracking.py``; they are public
through `accelerate_ref.tracking` only.
"""
