"""Choosing a view: image quality, decode speed, the fidelity curve and ``auto:SSIM``, the plateau schedule.

Importing it registers the resolver of ``fidelity auto:SSIM`` (:func:`fanfs.records.register_resolver`).
"""

from . import fidelity  # noqa: F401  (registers its resolver)
