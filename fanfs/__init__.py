"""fanfs: a read-only, compressed, progressive file-system cache for deep-learning training."""

__version__ = "0.1.0"
