"""Fidelity chosen by the training (PyTorch): PCR's gradient test and a schedule that raises fidelity.

Both talk to a running mount through its control socket, so the training's own ``Dataset`` and
``DataLoader`` (workers included) stay unmodified: files opened after a switch get the new fidelity.
torch is imported only when a function needs it (``pip install torch==2.13.0``, the CPU build: the
``torch`` extra, ``pip install -e '.[torch]'`` from the checkout).
"""

from .gradient import FidelityChoice, choose_fidelity
from .fidelity_schedule import fidelity_levels, fidelity_schedule

__all__ = ["FidelityChoice", "choose_fidelity", "fidelity_levels", "fidelity_schedule"]
