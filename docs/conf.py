"""Sphinx configuration of fanfs's documentation: ``sphinx-build -W docs docs/_build/html``
(tests/test_docs.py builds it so, warnings as errors)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's fanfs, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the in-repo extension(s)

import fanfs  # noqa: E402

project = "fanfs"
copyright = "fanfs authors"
release = version = fanfs.__version__
extensions = ["sphinx.ext.autodoc", "cliref"]
exclude_patterns = ["_build"]
html_theme = "alabaster"
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
