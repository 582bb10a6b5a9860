"""Progressive JPEG records: lossless baseline->progressive transcoding and splitting into layers.

A progressive JPEG is cut at scan boundaries into "layers"; the first k layers closed by an EOI
marker form a smaller, still valid JPEG (fidelity k). Pure library: no FUSE, no store knowledge.
The transcoder is libturbojpeg's tjTransform through ctypes (in-process, 7-40 ms per photo here); a
custom scan script, which tjTransform cannot take, goes through the ``jpegtran`` binary.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import re
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Sequence

__all__ = ["EOI", "JpegError", "ScanScript", "looks_like_jpeg", "to_progressive", "split_layers",
           "present", "presented_size"]

EOI = b"\xff\xd9"
SOI = b"\xff\xd8"


class JpegError(ValueError):
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


def _sof(data: bytes) -> tuple[int, int]:
    """(SOF marker, number of components) of the first frame; JpegError if none."""
    if not data.startswith(SOI):
        raise JpegError("not a JPEG")
    for marker, start, end in _segments(data):
        if marker in _SOF:
            if end - start < 10:
                raise JpegError(f"short SOF segment at byte {start}")
            return marker, data[start + 9]
        if marker in (0xDA, 0xD9):
            break
    raise JpegError("no SOF marker before the first scan")


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


# ---------------------------------------------------------------------------------------------
# Scan scripts (jpegtran -scans format)

_MAX_AH_AL = 10  # libjpeg's limit for 8-bit samples


class ScanScript:
    """A progression script in jpegtran's ``-scans`` text format, e.g. ``0,1,2: 0-0, 0, 1;``.

    Checked at parse time with libjpeg's rules plus one more: every bit of every coefficient of
    every component must be sent, since libjpeg accepts incomplete (lossy) scripts.
    """

    __slots__ = ("text", "scans")

    def __init__(self, text: str):
        self.text = text
        # (components, Ss, Se, Ah, Al)
        self.scans: tuple[tuple[tuple[int, ...], int, int, int, int], ...] = tuple(_parse_scans(text))

    @classmethod
    def load(cls, path: str | Path) -> "ScanScript":
        return cls(Path(path).read_text())

    @property
    def components(self) -> int:
        """Number of image components the script codes."""
        return 1 + max(c for comps, *_ in self.scans for c in comps)

    def restricted(self, ncomp: int) -> "ScanScript":
        """The same progression for the first ``ncomp`` components only (e.g. grayscale images
        under a colour script): each component's progression is independent of the others."""
        lines = []
        for comps, ss, se, ah, al in self.scans:
            kept = [c for c in comps if c < ncomp]
            if kept:
                lines.append(f"{' '.join(map(str, kept))}: {ss} {se} {ah} {al};")
        return ScanScript("\n".join(lines) + "\n")

    def __len__(self) -> int:
        return len(self.scans)

    def __repr__(self) -> str:
        return f"ScanScript({len(self.scans)} scans, {self.components} components)"


def _parse_scans(text: str):
    """Parse and validate: integers separated by spaces, commas or '-'; ':' ends the component
    list, ';' (or the end) ends a scan and '#' starts a comment, as in libjpeg's reader."""
    body = re.sub(r"#[^\n]*", "", text)
    last_bit: dict[tuple[int, int], int] = {}  # (component, coefficient) -> lowest bit sent
    line = 1
    nscans = 0
    for chunk in body.split(";"):
        first = line + chunk[: len(chunk) - len(chunk.lstrip())].count("\n")
        line += chunk.count("\n")
        if not chunk.strip():
            continue

        def bad(why: str) -> JpegError:
            return JpegError(f"scan script line {first}: {why}: {chunk.strip()!r}")

        head, colon, tail = chunk.partition(":")
        if re.search(r"[^\d\s,\-:]", chunk):
            raise bad("unexpected character")
        comps = tuple(int(v) for v in re.findall(r"\d+", head))
        params = [int(v) for v in re.findall(r"\d+", tail)]
        if not colon or len(params) != 4:
            raise bad("expected 'components: Ss-Se, Ah, Al' (progressive scans only)")
        ss, se, ah, al = params
        if not 1 <= len(comps) <= 4:
            raise bad("a scan codes 1 to 4 components")
        if any(b <= a for a, b in zip(comps, comps[1:])):
            raise bad("component indexes must increase")
        if not (0 <= ss <= se <= 63) or ah > _MAX_AH_AL or al > _MAX_AH_AL:
            raise bad("need 0 <= Ss <= Se <= 63 and Ah, Al <= 10")
        if ss == 0 and se != 0:
            raise bad("DC (Ss=0) and AC coefficients cannot share a scan")
        if ss > 0 and len(comps) != 1:
            raise bad("an AC scan codes a single component")
        for c in comps:
            if ss > 0 and (c, 0) not in last_bit:
                raise bad(f"AC of component {c} before its DC")
            for k in range(ss, se + 1):
                prev = last_bit.get((c, k))
                if ah == 0 and prev is not None:
                    raise bad(f"coefficient {k} of component {c} sent twice")
                if ah != 0 and (prev != ah or al != ah - 1):
                    raise bad(f"refinement of coefficient {k} of component {c} does not follow "
                              f"its previous scan (Ah must equal the previous Al, Al = Ah - 1)")
                last_bit[(c, k)] = al
        nscans, last_line = nscans + 1, first
        yield comps, ss, se, ah, al
    if not nscans:
        raise JpegError("scan script line 1: empty script")
    ncomp = 1 + max(c for c, _ in last_bit)
    for c in range(ncomp):
        missing = [k for k in range(64) if last_bit.get((c, k)) != 0]
        if missing:
            raise JpegError(f"scan script line {last_line}: incomplete: {len(missing)} coefficient(s) of "
                            f"component {c}, first {missing[0]}, not sent down to bit 0 (lossy)")


# ---------------------------------------------------------------------------------------------
# Transcoding

TJXOP_NONE = 0
TJXOPT_PROGRESSIVE = 32  # libjpeg-turbo 2.1 turbojpeg.h; progressive implies Huffman optimisation
TJFLAG_STOPONWARNING = 8192
TJFLAG_LIMITSCANS = 32768  # refuse progressive input with > 500 scans (CPU exhaustion)
TJERR_WARNING = 0


class _TjRegion(ctypes.Structure):
    _fields_ = [("x", ctypes.c_int), ("y", ctypes.c_int), ("w", ctypes.c_int), ("h", ctypes.c_int)]


class _TjTransform(ctypes.Structure):
    _fields_ = [("r", _TjRegion), ("op", ctypes.c_int), ("options", ctypes.c_int),
                ("data", ctypes.c_void_p), ("customFilter", ctypes.c_void_p)]


_lib: ctypes.CDLL | None = None
_lib_lock = threading.Lock()
_XFORM = _TjTransform(op=TJXOP_NONE, options=TJXOPT_PROGRESSIVE)  # read-only, shared


def _libturbojpeg() -> ctypes.CDLL:
    global _lib
    with _lib_lock:
        if _lib is None:
            name = ctypes.util.find_library("turbojpeg") or "libturbojpeg.so.0"
            try:
                lib = ctypes.CDLL(name)
            except OSError as e:
                raise JpegError(f"libturbojpeg not available: {e}") from None
            lib.tjInitTransform.restype = ctypes.c_void_p
            lib.tjInitTransform.argtypes = []
            lib.tjTransform.restype = ctypes.c_int
            lib.tjTransform.argtypes = [
                ctypes.c_void_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_int,
                ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_ulong),
                ctypes.POINTER(_TjTransform), ctypes.c_int]
            lib.tjGetErrorStr2.restype = ctypes.c_char_p
            lib.tjGetErrorStr2.argtypes = [ctypes.c_void_p]
            lib.tjGetErrorCode.restype = ctypes.c_int
            lib.tjGetErrorCode.argtypes = [ctypes.c_void_p]
            lib.tjFree.restype = None
            lib.tjFree.argtypes = [ctypes.c_void_p]
            lib.tjDestroy.restype = ctypes.c_int
            lib.tjDestroy.argtypes = [ctypes.c_void_p]
            _lib = lib
        return _lib


class _Transformer:
    """One tjhandle and its output slots, per thread (a tjhandle is not thread-safe)."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        self.handle = lib.tjInitTransform()
        if not self.handle:
            raise JpegError("tjInitTransform failed")
        self.buf = ctypes.c_void_p()
        self.size = ctypes.c_ulong(0)

    def __del__(self):
        if getattr(self, "handle", None):
            self.lib.tjDestroy(self.handle)

    def progressive(self, data: bytes) -> bytes:
        lib, buf, size = self.lib, self.buf, self.size
        buf.value = None  # NULL: let the library allocate the output
        size.value = 0
        rc = lib.tjTransform(self.handle, data, len(data), 1, ctypes.byref(buf), ctypes.byref(size),
                             ctypes.byref(_XFORM), TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS)
        try:
            if rc != 0:
                kind = "warning" if lib.tjGetErrorCode(self.handle) == TJERR_WARNING else "error"
                msg = (lib.tjGetErrorStr2(self.handle) or b"?").decode(errors="replace").strip()
                raise JpegError(f"transcoder refused ({kind}): {msg}")
            return ctypes.string_at(buf.value, size.value)
        finally:
            if buf.value:
                lib.tjFree(buf)


_local = threading.local()


def _transformer() -> _Transformer:
    t = getattr(_local, "t", None)
    if t is None:
        t = _local.t = _Transformer(_libturbojpeg())
    return t


def _jpegtran(data: bytes, script: ScanScript) -> bytes:
    with tempfile.NamedTemporaryFile("w", suffix=".scans") as f:
        f.write(script.text)
        f.flush()
        try:
            p = subprocess.run(["jpegtran", "-copy", "all", "-optimize", "-strict", "-scans", f.name],
                               input=data, capture_output=True, check=False)
        except FileNotFoundError:
            raise JpegError("jpegtran not installed (needed for custom scan scripts)") from None
    if p.returncode != 0 or not p.stdout:
        msg = p.stderr.decode(errors="replace").strip().replace("\n", "; ")
        raise JpegError(f"transcoder refused: {msg or f'jpegtran exit {p.returncode}'}")
    return p.stdout


def to_progressive(data: bytes, scan_script: ScanScript | None = None) -> bytes:
    """Losslessly transcode a JPEG to progressive, keeping every marker (EXIF, ICC, COM).

    Raises JpegError on anything the transcoder refuses or warns about (truncated or corrupt
    entropy data decode with warnings into garbage). An input that is already a well-formed
    progressive JPEG comes back unchanged when no script is given.
    """
    if not isinstance(data, bytes):
        data = bytes(data)
    if not looks_like_jpeg(data[:4]):
        raise JpegError("not a JPEG")
    sof, ncomp = _sof(data)
    if scan_script is None:
        out = _transformer().progressive(data)  # also validates the whole entropy stream
        if sof == 0xC2:
            try:
                split_layers(data)
                return data
            except JpegError:
                pass  # e.g. bytes after EOI: serve the clean transcode instead
    else:
        if ncomp < scan_script.components:
            scan_script = scan_script.restricted(ncomp)
        out = _jpegtran(data, scan_script)
    split_layers(out)  # never hand out something the reader cannot split
    return out
