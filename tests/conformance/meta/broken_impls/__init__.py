"""Deliberately broken implementations of the Accelerate API, one break per module.

Each module is a complete implementation (``--impl broken_impls.<name>``)
that differs from `accelerate_ref` in exactly one documented rule; its
docstring names the rule and the catalog ID whose case must catch it. The
meta-tests (``tests/conformance/meta/test_suite.py``) run the conformance suite against
each one and assert that the break is reported.

Modules are built with `broken_impls._wrap.BrokenCopy`, which loads a private
copy of `accelerate_ref` and replaces one piece of it, so that every path to
the broken behaviour (``Accelerator`` method, ``utils`` function, ``state``
class) shows it, while the real `accelerate_ref` stays untouched.

``tests/`` (the parent directory) must be on ``sys.path`` to import them.
"""
