"""Sphinx configuration of the accelerate-ref documentation (MyST Markdown pages, autodoc, sphinx-argparse).

Build: ``make docs`` (``sphinx-build -W --keep-going -b html docs docs/_build/html``). The packages are
imported from the source tree, not from an installed copy.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# Importing accelerate_ref must not start anything: no ranks, no devices.
os.environ.setdefault("ACCELERATE_USE_CPU", "1")

project = "accelerate-ref"
author = "accelerate-ref contributors"
copyright = "accelerate-ref contributors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinxarg.ext",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "furo"
html_title = "accelerate-ref"
html_static_path: list[str] = []
