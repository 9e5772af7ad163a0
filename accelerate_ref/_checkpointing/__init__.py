"""Pieces of `accelerate_ref.checkpointing`: checkpoint directories that appear only when complete."""
