"""Fidelity chosen by the training (PyTorch): PCR's gradient test and a schedule that raises fidelity; and a
sampler that tells a mount the order it will read in (:class:`OrderSampler`), and one that chooses an order the
disk reads nearly in sequence (:class:`ShardShuffleSampler`).

Both talk to a running mount through its control socket, so the training's own ``Dataset`` and
``DataLoader`` (workers included) stay unmodified: files opened after a switch get the new fidelity.
torch is imported only when a function needs it (torch 2.13.0, the CPU build: the ``torch`` extra,
``.venv/bin/pip install -e '.[torch]'`` in the checkout).
"""

from ..errors import refuse_a_shadowed_package

refuse_a_shadowed_package()  # before anything of the package is imported

from .gradient import FidelityChoice, choose_fidelity
from .fidelity_schedule import fidelity_levels, fidelity_schedule
from .order import OrderSampler
from .shards import ShardShuffle, ShardShuffleSampler, shard_aware_order

__all__ = ["FidelityChoice", "OrderSampler", "ShardShuffle", "ShardShuffleSampler", "choose_fidelity",
           "fidelity_levels", "fidelity_schedule", "shard_aware_order"]
