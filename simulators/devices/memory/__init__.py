"""Memory accounting of the mock devices: what each device holds and reserves, its peak and what it held then.

The books of each device (``books``) and the model of torch's CUDA caching allocator behind them
(``caching_allocator``); what a GPU allocates that a CPU run never does (``cuda_libraries``, ``cuda_reduce``); the
peak's step, statement and split (``peaks``, ``activations``), the batches a dry run ran (``batches``), and the books'
timeline and allocation history (``history``). The calibration of these books against real GPUs lives at
``simulators/calibration.py`` (:mod:`simulators.calibration`).
"""
