"""Progressive JPEG records (PCR, Kuchnik et al., VLDB 2021): a JPEG as layers, one per scan.

At pack time a baseline (or progressive) JPEG is losslessly transcoded to progressive and cut at scan
boundaries (:mod:`.transcode`, :mod:`.markers`); layer 0 carries the headers and the first scan.  At
view K a mount presents the first K layers closed by an EOI marker: a smaller, still valid JPEG whose
decode is a coarser image.  Layers are stored as they are (scans are entropy-coded already).

Packed with ``--scales``, a record also holds its resolution tiers (:mod:`.tiers`) as side layers, one
blob each after its scans, in the order of the store's ``scales`` (its header's ``records.jpeg.scales``):
every tier or none (an image Pillow cannot reduce keeps its scans only, and is shown whole at a tier's
view).  A tier view (``TIER | s``) presents the tier's blob as the whole file.  Such a store is of format 3.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ...util.checksum import checksum
from ...util.images import decode_pixels
from ...util.source_file import SourceFile
from ...util.units import human_size
from ..base import FULL, SIDE_LAYER, AddOption, Columns, Packed, Presentation, Reader, RecordKind, expand, register
from .markers import EOI, JpegError, frame, looks_like_jpeg, split_layers
from .options import DEFAULT_MAX_PIXELS, FIDELITY, add_pack_options, asked, format_fidelity
from .scans import DEFAULT_SCANS, LIBJPEG, scan_script
from .tiers import DEFAULT_TIER_QUALITY, MAX_SCALE, MAX_TIERS, TIER, is_tier, make_tiers
from .transcode import to_progressive

TIERS_FORMAT = 3
"""The first store format that may hold resolution tiers (older fanfs refuse it by its version)."""

MAX_LAYERS = 64
MAX_SIZE = 64 << 20  # larger "JPEGs" are kept as plain files


@register
class JpegRecords(RecordKind):
    kind_id = 1
    name = "jpeg"
    label = "progressive records"
    setting = FIDELITY

    def __init__(self, scans: str = DEFAULT_SCANS, max_pixels: int = DEFAULT_MAX_PIXELS,
                 scales: tuple[int, ...] = (), tier_quality: int = DEFAULT_TIER_QUALITY) -> None:
        """``scans``: a preset name, ``libjpeg`` or a scan-script file (:func:`.scans.scan_script`);
        ``max_pixels``: larger JPEGs are kept as plain files (the transcode's memory grows with pixels);
        ``scales``: the resolution tiers to store (none by default); ``tier_quality``: their JPEG quality at most."""
        self.scan_script = scan_script(scans)
        self.max_pixels = max_pixels
        self.scales = tuple(scales)
        self.tier_quality = tier_quality
        if self.scales:
            self.since_format = TIERS_FORMAT  # what pack writes; the registry's instance reads every format

    # --- presentation -------------------------------------------------------------------------

    def setting_range(self, index: Columns, entries: np.ndarray) -> tuple[int, int]:
        files = entries[index.type[entries] == 1]
        return (1, int(index.layers[files].max())) if files.size else (FULL, FULL)

    def offered(self, index: Columns, entries: np.ndarray) -> list[int]:
        """The resolution tiers (coarsest first) if some record has them, then K = 1 .. most layers - 1."""
        tiered = entries.size and bool((index.count[entries] > index.layers[entries]).any())
        return (tier_values(index)[::-1] if tiered else []) + super().offered(index, entries)

    def setting_problem(self, index: Columns, entries: np.ndarray, value: int) -> str | None:
        if not is_tier(value):
            return super().setting_problem(index, entries, value)
        held = _scales(index)
        if _slot(index, value) >= 0 and (index.count[entries] > index.layers[entries]).any():
            return None
        hint = f"it holds {', '.join(f'1/{s}' for s in held)}" if held else "pack with --scales to store tiers"
        return f"fidelity {format_fidelity(value)}: this store has no such resolution tier ({hint})"

    def view(self, index: Columns, entry: int, presentation: Presentation) -> int:
        k = presentation[FIDELITY.name]
        if k < TIER:
            return k if k < int(index.layers[entry]) else FULL
        return k if k != FULL and _slot(index, k) >= 0 and int(index.count[entry]) > int(index.layers[entry]) else FULL

    def views(self, index: Columns, entries: np.ndarray, presentation: Presentation) -> np.ndarray:
        k = presentation[FIDELITY.name]
        if is_tier(k):
            tiered = index.count[entries] > index.layers[entries]
            return np.where(tiered & (_slot(index, k) >= 0), k, FULL).astype(np.int64)
        return np.where(index.layers[entries] > k, k, FULL).astype(np.int64)

    def presentation_notes(self, index: Columns, entries: np.ndarray, presentation: Presentation) -> list[str]:
        value = presentation[FIDELITY.name]
        if not is_tier(value) or not entries.size:
            return []
        whole = int((self.views(index, entries, presentation) == FULL).sum())
        return [f"fidelity {format_fidelity(value)}: {whole:,} of {entries.size:,} JPEG records have no such tier and "
                "are shown whole"] if whole else []

    def side_names(self, index: Columns) -> list[str]:
        return [format_fidelity(value) for value in tier_values(index)]

    def reads_within(self, view: int, other: int) -> bool:
        """A tier is read by its own view alone: K views (and full) read scans, never a tier."""
        if is_tier(view) or is_tier(other):
            return view == other
        return view <= other

    def blobs_read(self, index: Columns, entries: np.ndarray, presentation: Presentation) -> np.ndarray:
        """Layer i is blob ``first + i``: the first K of each record; at a tier, that tier's blob of each record
        that has it (the others are shown whole: their scans)."""
        value = presentation[FIDELITY.name]
        layers = index.layers[entries].astype(np.int64)
        first = index.first[entries].astype(np.int64)
        if is_tier(value) and _slot(index, value) >= 0:
            tiered = index.count[entries].astype(np.int64) > layers
            whole = expand(first[~tiered], layers[~tiered])[0]
            return np.concatenate([whole, first[tiered] + layers[tiered] + _slot(index, value)])
        return expand(first, np.minimum(layers, value))[0]

    def blob_ranks(self, index: Columns, entries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Scan i is rank i; a tier comes after every scan (``SIDE_LAYER`` + its slot)."""
        first, layers = index.first[entries].astype(np.int64), index.layers[entries].astype(np.int64)
        blobs, owner = expand(first, index.count[entries])
        position = blobs - first[owner]
        return blobs, np.where(position < layers[owner], position, SIDE_LAYER + position - layers[owner])

    def size(self, reader: Reader, entry: int, view: int) -> int:
        ix = reader.index
        if is_tier(view) and (blob := _tier_blob(ix, entry, view)) >= 0:  # else (a view no kind gave it): whole
            return int(ix.blob_raw[blob])
        if view >= int(ix.layers[entry]):
            return int(ix.size[entry])
        first = int(ix.first[entry])
        return int(ix.blob_raw[first:first + view].sum()) + len(EOI)

    def blob_run(self, index: Columns, entry: int, view: int, offset: int, size: int) -> tuple[int, int]:
        """The layers among the first ``view`` that bytes ``[offset, offset + size)`` touch: consecutive blobs; at a
        tier, its one blob."""
        if is_tier(view) and (blob := _tier_blob(index, entry, view)) >= 0:
            return (blob, 1)
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
        if is_tier(view) and (blob := _tier_blob(ix, entry, view)) >= 0:
            whole = offset == 0 and size >= int(ix.blob_raw[blob])
            return reader.blob(entry, blob, SIDE_LAYER + _slot(ix, view), keep=not whole)[offset:offset + size]
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
        problem = _scales_problem(index)
        if problem:
            return problem
        tiers = index.count[entries].astype(np.int64) - layers
        if ((tiers != 0) & (tiers != len(_scales(index)))).any():
            return "a JPEG record whose blob count is neither its layer count nor that plus the store's tiers"
        first = index.first[entries].astype(np.int64)
        if (_range_sums(index.blob_raw, first, layers.astype(np.int64)) != index.size[entries].astype(np.int64)).any():
            return "a JPEG record whose layers do not add up to its size"
        blobs, _ = expand(first, index.count[entries])
        if (index.blob_raw[blobs] == 0).any() or (index.blob_stored[blobs] != index.blob_raw[blobs]).any():
            return "a JPEG record with an empty or compressed layer or tier"
        if (index.blob_raw[blobs] > MAX_SIZE).any():
            return f"a JPEG record tier larger than {MAX_SIZE >> 20} MiB"
        return None

    def describe(self, index: Columns, entries: np.ndarray) -> dict[str, Any]:
        values, counts = np.unique(index.layers[entries], return_counts=True)
        out: dict[str, Any] = {"layers": {str(int(v)): int(c) for v, c in zip(values, counts)}}
        scales = _scales(index)
        if scales:
            tiered = int((index.count[entries] > index.layers[entries]).sum())
            quality = _tier_quality(index)
            first, layers = index.first[entries].astype(np.int64), index.layers[entries].astype(np.int64)
            scans = int(_range_sums(index.blob_stored, first, layers).sum())
            side = int(_range_sums(index.blob_stored, first + layers, index.count[entries].astype(np.int64) - layers).sum())
            out["tiers"] = {"scales": [f"1/{s}" for s in scales], "quality": quality, "records": tiered,
                            "without": int(entries.size) - tiered, "stored_bytes": side}
            at = "the sources' own" if quality == 100 else f"at most {quality}"
            out["notes"] = [f"resolution tiers {', '.join(out['tiers']['scales'])}: {tiered:,} records, "
                            f"{human_size(side)} stored (+{side / max(1, scans):.0%} over their scans); "
                            f"{entries.size - tiered:,} without (shown at full at a tier fidelity)",
                            f"tier quality: {at} (pack --tier-quality {quality})"]
        packed = (index.meta.get("records") or {}).get(self.name)
        if isinstance(packed, dict) and "scan_script" in packed:  # fanfs 0.1's format-1 stores do not say
            # before the presets, no script meant libjpeg's progression and a script came from a file
            name = packed.get("scan_preset", LIBJPEG if packed["scan_script"] is None else None)
            out["scan_script"] = str(name) if name else "file"
            out["notes"] = [f"scan script: {name or 'custom (from a file)'}", *out.get("notes", [])]
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

    def pack(self, source: SourceFile, head: bytes) -> Packed | str:
        if source.size > MAX_SIZE:
            return f"larger than {MAX_SIZE >> 20} MiB"
        data = source.read_all()
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
        tiers = make_tiers(data, self.scales, self.tier_quality) if self.scales else []
        notes = [tiers] if isinstance(tiers, str) else []
        side = [] if notes else [[tier] for tier in tiers]
        return Packed([[layer] for layer in layers], len(full), checksum(full), compress=False, notes=notes, side=side)

    def matches_source(self, reader: Reader, entry: int, source: SourceFile) -> str | None:
        """A JPEG record stands for its source when both decode to the same pixels."""
        try:
            presented = reader.read(entry, 0, int(reader.index.size[entry]))
            same = np.array_equal(decode_pixels(presented), decode_pixels(source.read_all()))
        except Exception as err:  # noqa: BLE001 - any decode failure is the answer
            return f"does not decode: {err}"
        return None if same else "JPEG record pixels differ from the source"

    def pack_config(self) -> dict[str, Any] | None:
        script = self.scan_script
        config = {"scan_script": script.text if script else None, "scan_preset": script.name if script else LIBJPEG,
                  "max_pixels": self.max_pixels}
        if not self.scales:
            return config  # as before tiers: format 1
        return {**config, "scales": list(self.scales), "tier_quality": self.tier_quality}


def _scales(index: Columns) -> tuple[int, ...]:
    """The store's resolution tiers (its header's ``records.jpeg.scales``, checked by :meth:`JpegRecords.check`)."""
    packed = (index.meta.get("records") or {}).get(JpegRecords.name)
    scales = packed.get("scales") if isinstance(packed, dict) else None
    return tuple(scales) if isinstance(scales, list) else ()


def _tier_quality(index: Columns) -> int:
    """The tiers' JPEG quality at most (``pack --tier-quality``); 100 (the sources' tables) in a store packed
    before the option (checked by :meth:`JpegRecords.check`)."""
    return int(index.meta["records"][JpegRecords.name].get("tier_quality", 100))


def tier_values(index: Columns) -> list[int]:
    """The fidelity values of the store's resolution tiers, finest first (``TIER | 2``, ``TIER | 4``); [] if none."""
    return [TIER | scale for scale in _scales(index)]


def _slot(index: Columns, value: int) -> int:
    """Which of a record's tiers fidelity ``value`` (a tier's code) shows: its position in the store's scales; -1 if none."""
    scales = _scales(index)
    scale = value & ~TIER
    return scales.index(scale) if is_tier(value) and scale in scales else -1


def _tier_blob(index: Columns, entry: int, view: int) -> int:
    """The blob of the record's tier shown at ``view`` (a tier's code); -1 if the record has no such tier."""
    slot = _slot(index, view)
    layers = int(index.layers[entry])
    return int(index.first[entry]) + layers + slot if slot >= 0 and int(index.count[entry]) > layers else -1


def _scales_problem(index: Columns) -> str | None:
    """What is wrong with the header's scales, if anything (a crafted index can carry any JSON)."""
    packed = (index.meta.get("records") or {}).get(JpegRecords.name)
    if not isinstance(packed, dict) or "scales" not in packed:
        return None
    scales = packed["scales"]
    if not (isinstance(scales, list) and 1 <= len(scales) <= MAX_TIERS
            and all(type(s) is int and 2 <= s <= MAX_SCALE for s in scales) and scales == sorted(set(scales))):
        return f"resolution tiers {scales!r}: not up to {MAX_TIERS} increasing factors from 2 to {MAX_SCALE}"
    quality = packed.get("tier_quality", 100)
    if not (type(quality) is int and 1 <= quality <= 100):
        return f"resolution tier quality {quality!r}: not a JPEG quality from 1 to 100"
    if index.meta["format"] < TIERS_FORMAT:
        return f"resolution tiers in a store of format {index.meta['format']}, which cannot hold them"
    return None


def _range_sums(values: np.ndarray, first: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Sum of ``values[first[i]:first[i] + count[i]]`` for each i, without a Python loop."""
    cumulative = np.concatenate([[0], np.cumsum(values, dtype=np.int64)])
    return cumulative[first + count] - cumulative[first]
