"""``torch_xla.distributed``: data loading, multiprocessing and the ``xla`` process-group backend."""
