"""Record kinds: how a file is cut into layers at pack time and presented at a view when read.

A store knows its files' bytes only as *blobs* grouped into *layers* (index columns ``first``/``count``:
the file's blobs, file-major; ``layers``; ``record``: the kind id).  A record kind gives them meaning:

* plain files (:mod:`.plain`): one layer of 1 MiB chunks, presented as the original bytes;
* extents (:mod:`.extent`): large files stored raw as one page-aligned run of their shard, read like plain files
  and spliced by the FUSE front;
* progressive JPEG records (:mod:`.jpeg`): one layer per scan, presented as the first K scans + EOI;
* float records (:mod:`.floats`): the values of .npy/safetensors files as byte planes, one layer per
  plane, presented at a precision (the first 8k bits of each value).

The store, the FUSE front, pack, info, verify, the command line and a Slurm job hold no per-kind branch:
they call a kind through this interface, looked up by the id stored in the index (or by name), and read
what kinds declare from this registry: presentation settings (:mod:`.settings`), pack and select options,
what ``info`` says.  Adding a kind is one module (or folder) here defining a :class:`RecordKind` subclass
decorated with :func:`register`, and its import below.

A *view* is a kind's name for one presentation of a file (JPEG: K layers), :data:`FULL` for the whole
file; :class:`Presentation` holds a mount's settings from which each kind derives its files' views.
"""

from . import extent, floats, jpeg, plain  # noqa: F401  (each registers its kind)
from .base import (SIDE_LAYER, SIDE_LAYERS, AddOption, Packed, Reader, RecordKind, blob_ranks, blob_shards, blobs_read,
                   check_presentation, expand, kind_named, kind_table, kinds, offered, pack_kinds, presentation_notes,
                   register, side_names)
from .plain import CHUNK_SIZE, PlainFiles
from .settings import (FULL, Auto, Presentation, Setting, Value, parse, parse_all, parse_level, register_resolver,
                       resolve, setting, settings, unresolved)

__all__ = ["CHUNK_SIZE", "FULL", "SIDE_LAYER", "SIDE_LAYERS", "AddOption", "Auto", "Packed", "PlainFiles", "Presentation", "Reader", "RecordKind", "Setting", "Value",
           "blob_ranks", "blob_shards", "blobs_read", "check_presentation", "expand", "kind_named", "kind_table", "kinds", "offered", "pack_kinds", "presentation_notes", "parse",
           "parse_all", "parse_level", "register", "register_resolver", "resolve", "setting", "settings", "side_names", "unresolved"]
