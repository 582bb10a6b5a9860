"""The JPEG file format as fanfs needs it: finding markers, cutting a progressive JPEG into layers.

A progressive JPEG is cut at scan boundaries into "layers"; the first k layers closed by an EOI marker
form a smaller, still valid JPEG (fidelity k).  Pure library: no store knowledge, no transcoding.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

from ...errors import FanfsError

EOI = b"\xff\xd9"
SOI = b"\xff\xd8"


class JpegError(FanfsError, ValueError):
    """The data is not a JPEG this module can handle; the message says why."""


def looks_like_jpeg(head: bytes) -> bool:
    """Content sniffing on the first 4 bytes: SOI followed by the start of a marker."""
    return len(head) >= 4 and head[:3] == b"\xff\xd8\xff" and 0xC0 <= head[3] <= 0xFE


# ---------------------------------------------------------------------------------------------
# Marker walking

# Markers without a length field (RSTn, TEM); everything else from C0 up carries one.
_STANDALONE = frozenset(range(0xD0, 0xD8)) | {0x01}
# End of an entropy-coded segment: FF followed by anything but a stuffed 00 or RST0-7.
# FF FF is fill before a marker, so it ends the segment too.
_SCAN_END = re.compile(rb"\xff[\x01-\xcf\xd8-\xff]")
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _segments(data: bytes):
    """Yield (marker, start, end) per marker segment after SOI; a SOS segment's end includes
    its entropy-coded data. Stops after EOI. Lengths are trusted, never searched for."""
    n, pos = len(data), 2
    while True:
        if pos >= n:
            raise JpegError(f"truncated at byte {n}: no EOI")
        if data[pos] != 0xFF:
            raise JpegError(f"expected a marker at byte {pos}, found 0x{data[pos]:02x}")
        start = pos
        while pos < n and data[pos] == 0xFF:  # fill bytes may precede a marker
            pos += 1
        if pos >= n:
            raise JpegError(f"truncated at byte {n}")
        marker = data[pos]
        pos += 1
        if marker == 0xD9:
            yield marker, start, pos
            return
        if marker in _STANDALONE:
            yield marker, start, pos
            continue
        if marker == 0x00 or marker == 0xD8:
            raise JpegError(f"invalid marker 0xff{marker:02x} at byte {start}")
        if pos + 2 > n:
            raise JpegError(f"truncated at byte {n}")
        end = pos + ((data[pos] << 8) | data[pos + 1])
        if end - pos < 2:
            raise JpegError(f"bad segment length at byte {pos}")
        if end > n:
            raise JpegError(f"truncated at byte {n}: segment 0xff{marker:02x} at {start} ends at {end}")
        if marker == 0xDA:
            m = _SCAN_END.search(data, end)
            if m is None:
                raise JpegError(f"truncated at byte {n}: scan at {start} has no end")
            end = m.start()
        yield marker, start, end
        pos = end


class Frame(NamedTuple):
    """A JPEG's frame header (SOF): what it says about the image, read without decoding anything."""

    marker: int
    components: int
    width: int
    height: int

    @property
    def pixels(self) -> int:
        return self.width * self.height


def frame(data: bytes) -> Frame:
    """The first frame header of a JPEG (or of its first layer); JpegError if there is none before a scan."""
    if not data.startswith(SOI):
        raise JpegError("not a JPEG")
    for marker, start, end in _segments(data):
        if marker in _SOF:
            body = start
            while data[body] == 0xFF:  # fill bytes, then the marker
                body += 1
            body += 3  # the marker and the segment's length
            if end - body < 6:
                raise JpegError(f"short SOF segment at byte {start}")
            height, width = (data[body + 1] << 8) | data[body + 2], (data[body + 3] << 8) | data[body + 4]
            return Frame(marker, data[body + 5], width, height)
        if marker in (0xDA, 0xD9):
            break
    raise JpegError("no SOF marker before the first scan")


def end_of_image(data: bytes) -> int:
    """Where the first image of a JPEG ends: just after its EOI, found by walking segment lengths and the
    entropy-coded data (never by searching for FFD9, which EXIF thumbnails and scan data may hold)."""
    end = 0
    for _, _, end in _segments(data):
        pass
    return end


def split_layers(progressive: bytes) -> list[bytes]:
    """Cut a progressive JPEG into layers, one per scan; layer 0 carries the headers and a
    table segment between scans belongs to the following scan's layer."""
    if not progressive.startswith(SOI):
        raise JpegError("not a JPEG")
    cuts = []  # end offsets of every scan's entropy data
    sof = None
    tail = 0
    for marker, start, end in _segments(progressive):
        if marker == 0xDA:
            if sof is None:
                raise JpegError(f"scan at byte {start} before any SOF")
            cuts.append(end)
        elif marker in _SOF:
            if sof is not None:
                raise JpegError(f"second SOF marker at byte {start}")
            if marker != 0xC2:
                raise JpegError(f"not a progressive (Huffman) JPEG: SOF 0xff{marker:02x}")
            sof = marker
        tail = end
    if not cuts:
        raise JpegError("no scan")
    if tail != len(progressive):
        raise JpegError(f"{len(progressive) - tail} bytes after EOI")
    cuts[-1] = tail
    bounds = [0, *cuts]
    return [progressive[a:b] for a, b in zip(bounds, cuts)]


def present(layers: Sequence[bytes], k: int) -> bytes:
    """The JPEG of fidelity k: the first k layers, closed by EOI unless all are there
    (any k >= len(layers) presents the whole file)."""
    if k < 1:
        raise ValueError(f"fidelity must be >= 1, got {k}")
    if k >= len(layers):
        return b"".join(layers)
    return b"".join((*layers[:k], EOI))


def presented_size(layer_sizes: Sequence[int], k: int) -> int:
    """len(present(layers, k)) from the layer sizes alone."""
    if k < 1:
        raise ValueError(f"fidelity must be >= 1, got {k}")
    if k >= len(layer_sizes):
        return sum(layer_sizes)
    return sum(layer_sizes[:k]) + len(EOI)
