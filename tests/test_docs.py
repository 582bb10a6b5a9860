"""The documentation: README.rst is valid reStructuredText (it is also the package's long description), and the
Sphinx pages under docs/ build with warnings as errors, so a broken reference, a section label that went
away or a docstring that does not parse fails the suite."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_readme_is_valid_restructuredtext():
    docutils_core = pytest.importorskip("docutils.core")
    html = docutils_core.publish_string((REPO / "README.rst").read_text(), writer="html",
                                        settings_overrides={"halt_level": 2, "report_level": 2})
    assert b"Quick start" in html


def test_readme_is_a_front_page():
    """What, why, the two commands, a short usage, a picture and links: at most 300 lines."""
    readme = (REPO / "README.rst").read_text()
    assert len(readme.splitlines()) <= 300
    for command in ("tools/demo", "tools/test"):
        assert f"\n   {command} " in readme
    for page in sorted((REPO / "docs").glob("*.rst")):
        if page.name != "index.rst":
            assert f"<docs/{page.name}>`__" in readme, f"README links no docs/{page.name}"


@pytest.mark.slow
def test_docs_build_without_warnings(tmp_path):
    pytest.importorskip("sphinx")
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                           "-d", str(tmp_path / "doctrees"), str(REPO / "docs"), str(tmp_path / "html")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "html" / "cli.html").exists() and (tmp_path / "html" / "api.html").exists()


def test_every_command_block_of_the_admin_page_is_run_by_a_test():
    """docs/admin.rst (issue 50): each of its command blocks is named, and a test runs it from the page's own text
    (``admin_block(NAME)``, tests/support/admin_page.py), so the page cannot drift from what works."""
    from support.admin_page import blocks
    found = [(language, name) for language, name, _ in blocks()]
    assert found and all(name for language, name in found if language == "sh"), found
    tests = "".join(path.read_text() for path in (REPO / "tests").glob("test_*.py"))
    assert [name for language, name in found if language == "sh" and f'admin_block("{name}"' not in tests] == []
