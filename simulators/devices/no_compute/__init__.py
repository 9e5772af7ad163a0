"""No-compute mode (``SIMULATORS_NO_COMPUTE=1``) and what else spares a dry run's ranks CPU time.

Mock tensors carry meta payloads and values are placeholders (``meta_payloads``), the script's large host tensors hold no
memory either (``lazy_host``), and each distinct op's metadata is computed once (``meta_results``); torch's Python
costs that grow with a model's parameters are cut without changing torch's answers (``foreach_sharding``,
``mesh_concatenation``).
"""
