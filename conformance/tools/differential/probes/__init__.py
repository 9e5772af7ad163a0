"""The probes, one module per public area of HF accelerate (the module names follow HF's).

Each module registers its probes with :func:`conformance.tools.differential.probe.probe`;
the harness imports every module here.
"""
