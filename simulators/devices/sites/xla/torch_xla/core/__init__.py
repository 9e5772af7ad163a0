"""``torch_xla.core``: the device model (``xla_model``)."""
