"""A case that declares a module it imports: the simulated backend's fork server imports it for the ranks.

Registered under a ``fixture.`` ID, outside the suite.
"""

from __future__ import annotations

import sys

from conformance.engine.case import case

#: A standard-library module nothing else in a rank imports.
DECLARED = "tabnanny"


@case("fixture.declared_import", worlds=[1, 2], imports=(DECLARED,))
def declared_import_loaded(impl, world):
    """Whether the declared module was imported before the case began (it never imports it itself)."""
    return DECLARED in sys.modules


@declared_import_loaded.check
def _imported_on_every_rank(values, world):
    assert values == [True] * world.size, f"{DECLARED} in sys.modules when the case began, per rank: {values}"
