"""``torch_xla.debug``: metrics."""
