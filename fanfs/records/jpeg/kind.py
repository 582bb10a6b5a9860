"""Progressive JPEG records (PCR, Kuchnik et al., VLDB 2021): a JPEG as layers, one per scan.

At pack time a baseline (or progressive) JPEG is losslessly transcoded to progressive and cut at scan
boundaries (:mod:`.transcode`, :mod:`.markers`); layer 0 carries the headers and the first scan.  At
view K a mount presents the first K layers closed by an EOI marker: a smaller, still valid JPEG whose
decode is a coarser image.  Layers are stored as they are (scans are entropy-coded already).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, BinaryIO

import numpy as np

from ...util.checksum import checksum
from ...util.images import decode_pixels
from ..base import AddOption, Columns, FULL, Packed, Presentation, Reader, RecordKind, expand, read_all, register
from .markers import EOI, JpegError, frame, looks_like_jpeg, split_layers
from .options import DEFAULT_MAX_PIXELS, FIDELITY, add_pack_options, asked
from .scans import DEFAULT_SCANS, LIBJPEG, scan_script
from .transcode import to_progressive

MAX_LAYERS = 64
MAX_SIZE = 64 << 20  # larger "JPEGs" are kept as plain files


@register
class JpegRecords(RecordKind):
    kind_id = 1
    name = "jpeg"
    label = "progressive records"
    setting = FIDELITY

    def __init__(self, scans: str = DEFAULT_SCANS, max_pixels: int = DEFAULT_MAX_PIXELS) -> None:
        """``scans``: a preset name, ``libjpeg`` or a scan-script file (:func:`.scans.scan_script`);
        ``max_pixels``: larger JPEGs are kept as plain files (the transcode's memory grows with pixels)."""
        self.scan_script = scan_script(scans)
        self.max_pixels = max_pixels

    # --- presentation -------------------------------------------------------------------------

    def setting_range(self, index: Columns, entries: np.ndarray) -> tuple[int, int]:
        files = entries[index.type[entries] == 1]
        return (1, int(index.layers[files].max())) if files.size else (FULL, FULL)

    def view(self, index: Columns, entry: int, presentation: Presentation) -> int:
        k = presentation[FIDELITY.name]
        return k if k < int(index.layers[entry]) else FULL

    def views(self, index: Columns, entries: np.ndarray, presentation: Presentation) -> np.ndarray:
        k = presentation[FIDELITY.name]
        return np.where(index.layers[entries] > k, k, FULL).astype(np.int64)

    def blobs_read(self, index: Columns, entries: np.ndarray, presentation: Presentation) -> np.ndarray:
        """Layer i is blob ``first + i``: the first K of each record."""
        shown = np.minimum(index.layers[entries].astype(np.int64), presentation[FIDELITY.name])
        return expand(index.first[entries], shown)[0]

    def size(self, reader: Reader, entry: int, view: int) -> int:
        ix = reader.index
        if view >= int(ix.layers[entry]):
            return int(ix.size[entry])
        first = int(ix.first[entry])
        return int(ix.blob_raw[first:first + view].sum()) + len(EOI)

    def blob_run(self, index: Columns, entry: int, view: int, offset: int, size: int) -> tuple[int, int]:
        """The layers among the first ``view`` that bytes ``[offset, offset + size)`` touch: consecutive blobs."""
        first, shown = int(index.first[entry]), min(view, int(index.layers[entry]))
        start = end = pos = 0
        for layer, length in enumerate(index.blob_raw[first:first + shown].tolist()):
            if pos + length <= offset:
                start = layer + 1
            if pos < offset + size:
                end = layer + 1
            pos += length
        return (first + start, max(0, end - start))

    def read(self, reader: Reader, entry: int, view: int, offset: int, size: int) -> bytes:
        """The first ``view`` layers, then an EOI unless every layer is shown."""
        ix = reader.index
        first, layers = int(ix.first[entry]), int(ix.layers[entry])
        shown = min(view, layers)
        raw = ix.blob_raw
        parts = []
        pos = 0
        end = offset + size
        for layer in range(shown):
            length = int(raw[first + layer])
            if pos + length > offset and pos < end:
                whole = offset <= pos and pos + length <= end
                data = reader.blob(entry, first + layer, layer, keep=not whole)
                parts.append(data[max(0, offset - pos):end - pos])
            pos += length
            if pos >= end:
                break
        if shown < layers and pos < end:
            parts.append(EOI[max(0, offset - pos):end - pos])
        return b"".join(parts)

    # --- index --------------------------------------------------------------------------------

    def check(self, index: Columns, entries: np.ndarray) -> str | None:
        layers = index.layers[entries]
        if ((layers < 1) | (layers > MAX_LAYERS)).any():
            return f"a JPEG record with no layer or more than {MAX_LAYERS}"
        if (index.count[entries] != layers).any():
            return "a JPEG record whose blob count is not its layer count"
        first = index.first[entries].astype(np.int64)
        if (_range_sums(index.blob_raw, first, layers.astype(np.int64)) != index.size[entries].astype(np.int64)).any():
            return "a JPEG record whose layers do not add up to its size"
        blobs, _ = expand(first, layers)
        if (index.blob_raw[blobs] == 0).any() or (index.blob_stored[blobs] != index.blob_raw[blobs]).any():
            return "a JPEG record with an empty or compressed layer"
        return None

    def describe(self, index: Columns, entries: np.ndarray) -> dict[str, Any]:
        values, counts = np.unique(index.layers[entries], return_counts=True)
        out: dict[str, Any] = {"layers": {str(int(v)): int(c) for v, c in zip(values, counts)}}
        packed = (index.meta.get("records") or {}).get(self.name)
        if isinstance(packed, dict) and "scan_script" in packed:  # fanfs 0.1's format-1 stores do not say
            # before the presets, no script meant libjpeg's progression and a script came from a file
            name = packed.get("scan_preset", LIBJPEG if packed["scan_script"] is None else None)
            out["scan_script"] = str(name) if name else "file"
            out["notes"] = [f"scan script: {name or 'custom (from a file)'}"]
        return out

    def summary(self, described: Mapping[str, Any]) -> str:
        layers = ", ".join(f"{k}: {v}" for k, v in described.get("layers", {}).items())
        return f" (layers: {layers})" if layers else ""

    # --- pack ---------------------------------------------------------------------------------

    @classmethod
    def pack_options(cls, add: AddOption) -> None:
        add_pack_options(add)

    @classmethod
    def for_pack(cls, options: Mapping[str, Any], plan_record: Mapping[str, Any] | None) -> RecordKind | None:
        arguments = asked(options)
        return None if arguments is None else cls(**arguments)

    def claims(self, head: bytes) -> bool:
        return looks_like_jpeg(head[:4])

    def pack(self, fd: int, size: int, head: bytes) -> Packed | str:
        if size > MAX_SIZE:
            return f"larger than {MAX_SIZE >> 20} MiB"
        data = read_all(fd, size)
        try:
            image = frame(data)  # the pixel count from the header, before anything is decoded
            if image.pixels > self.max_pixels:
                return (f"{image.width}x{image.height} = {image.pixels:,} pixels, "
                        f"more than --max-pixels {self.max_pixels:,}")
            layers = split_layers(to_progressive(data, self.scan_script))
        except JpegError as err:
            return str(err)
        if len(layers) > MAX_LAYERS:
            return f"{len(layers)} scans, more than {MAX_LAYERS}"
        full = b"".join(layers)
        return Packed([[layer] for layer in layers], len(full), checksum(full), compress=False)

    def matches_source(self, reader: Reader, entry: int, source: BinaryIO) -> str | None:
        """A JPEG record stands for its source when both decode to the same pixels."""
        try:
            presented = reader.read(entry, 0, int(reader.index.size[entry]))
            same = np.array_equal(decode_pixels(presented), decode_pixels(source.read()))
        except Exception as err:  # noqa: BLE001 - any decode failure is the answer
            return f"does not decode: {err}"
        return None if same else "JPEG record pixels differ from the source"

    def pack_config(self) -> dict[str, Any] | None:
        script = self.scan_script
        return {"scan_script": script.text if script else None, "scan_preset": script.name if script else LIBJPEG,
                "max_pixels": self.max_pixels}


def _range_sums(values: np.ndarray, first: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Sum of ``values[first[i]:first[i] + count[i]]`` for each i, without a Python loop."""
    cumulative = np.concatenate([[0], np.cumsum(values, dtype=np.int64)])
    return cumulative[first + count] - cumulative[first]
