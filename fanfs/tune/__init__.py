"""Choosing a view: image quality (SSIM, MS-SSIM) and the fidelity curve behind ``auto:SSIM``."""
