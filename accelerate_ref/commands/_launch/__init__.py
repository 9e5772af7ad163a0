"""Pieces of ``accelerate_ref.commands.launch`` kept apart (🤗 Accelerate keeps them in ``commands/launch.py``)."""
