"""The mock device families: what makes a CPU-only torch see CUDA (GPU-shaped), XLA (TPU-shaped) or NPU
(Ascend-shaped) devices.

One module per family (:mod:`~simulators.devices.families.cuda`, :mod:`~simulators.devices.families.xla`,
:mod:`~simulators.devices.families.npu`), installed by its stand-in package under ``simulators/devices/sites``, and
the pieces they share: device tensors on CPU payloads (``tensor``), torch's PrivateUse1 backend set up from Python
(``backend``), the ``torch.<device>`` module API (``runtime``), the simulated machine and its GPUs (``machine``,
``gpus``), ``torch.load`` onto a mock device (``loading``), libraries' parameter subclasses on mock data
(``parameter_subclasses``), patches applied when a module is first imported (``import_hooks``), and XLA's replicas
and step graphs (``replicas``, ``steps``).
"""
