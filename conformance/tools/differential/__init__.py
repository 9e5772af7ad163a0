"""The behavioural differential: one public behaviour, two implementations, every difference reported.

A *probe* (:mod:`.probe`) is a small function that exercises public behaviour
with fixed inputs. It runs once under the candidate implementation
(``--impl``) and once under the reference (``--against``, HF accelerate by
default), with the same seed, environment and a fresh temporary folder each
time; everything it sees is turned into plain data (:mod:`.observe`):

* return values: tensors by dtype, device, shape and value; containers
  recursively; enums, dataclasses and classes by name;
* what an object *is*: the reference's public classes it is an instance of
  (looked up in each implementation under the same public path) and the
  classes of torch, torchdata, numpy and the standard library in its MRO;
* exceptions (type, ancestry and message), warnings (category and text),
  log records of the implementation's loggers (name, level, text), printed
  output, and the files a probe wrote (names, and keys and shapes of
  checkpoint files).

Implementation names inside texts are normalised (``accelerate_ref`` reads as
``accelerate``), as are temporary paths and object addresses, so only real
differences remain. Single-process probes run in the driver's own process,
interleaved (reference, then candidate, per probe); probes of a distributed
behaviour run on 2 simulated ranks, and probes of a device-dependent one on
the simulator's mock CUDA too (:mod:`.runner`). A difference is either fixed
or listed, with its reason, in the candidate's deviation file
(:mod:`.deviations`; ``accelerate_ref/DIFFERENTIAL.toml`` for the reference
implementation). ``python -m conformance differential`` exits 1 on an
unexplained difference or a stale deviation.
"""
