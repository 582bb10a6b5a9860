"""A store on disk and its reader: format, index (validated at open), shard sources, blob cache, Store."""

from ..records import FULL, Presentation
from .reader import Store
from .stats import Stats

__all__ = ["FULL", "Presentation", "Stats", "Store"]
