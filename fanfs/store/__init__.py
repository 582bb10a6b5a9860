"""A store on disk and its reader: format, index (validated at open), shard sources, blob cache, Store."""

from ..records import FULL, Presentation
from .reader import Stats, Store

__all__ = ["FULL", "Presentation", "Stats", "Store"]
