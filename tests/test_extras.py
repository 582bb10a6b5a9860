"""fanfs without its extras: matplotlib is ``fanfs[plots]``, needed only for ``--plot``.

matplotlib is hidden from the commands run here by a package of that name, first on PYTHONPATH, whose
import fails as a missing one does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fanfs_command import fanfs
from photo_samples import make_photo_set


@pytest.fixture
def without_matplotlib(tmp_path: Path) -> dict[str, str]:
    """An environment in which ``import matplotlib`` fails."""
    hidden = tmp_path / "hidden" / "matplotlib"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text('raise ImportError("No module named \'matplotlib\' (hidden by the test)")\n')
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(hidden.parent), os.environ.get("PYTHONPATH")]))}


def test_plot_without_matplotlib_is_one_line_naming_the_extra_before_anything_is_measured(tmp_path, without_matplotlib):
    make_photo_set(tmp_path / "src", 3)
    fanfs("pack", tmp_path / "src", tmp_path / "store", "--progressive-jpeg", "--quiet")
    for command in (("fidelity", tmp_path / "store"), ("select", tmp_path / "src")):
        done = fanfs(*command, "--plot", tmp_path / "plot.png", check=False, env=without_matplotlib)
        assert done.returncode == 1, done.stderr
        assert done.stderr.strip() == ("fanfs: error: --plot needs matplotlib, which is not installed: "
                                       "pip install 'matplotlib>=3.7' (fanfs's plots extra; from its checkout: "
                                       ".venv/bin/pip install -e '.[plots]')"), done.stderr
        assert not done.stdout and not (tmp_path / "plot.png").exists()


def test_the_demo_sample_needs_no_matplotlib(tmp_path, without_matplotlib):
    """``fanfs demo``'s photo comes with fanfs."""
    code = "import sys; from fanfs.cli.sample import make_sample; make_sample(sys.argv[1], images_per_class=2)"
    subprocess.run([sys.executable, "-c", code, tmp_path / "sample"], env=without_matplotlib, check=True)
    assert len(list((tmp_path / "sample" / "train").rglob("*.JPEG"))) == 8
