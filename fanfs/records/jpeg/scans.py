"""Progressive scan scripts in jpegtran's ``-scans`` format, validated so that only lossless ones pass,
and the named presets ``pack --scan-script`` offers (chosen by measurement: docs/fidelity.rst, "Scan scripts").
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ...errors import FanfsError
from ...util.files import read_regular
from .markers import JpegError

_MAX_AH_AL = 10  # libjpeg's limit for 8-bit samples


class ScanScript:
    """A progression script in jpegtran's ``-scans`` text format, e.g. ``0,1,2: 0-0, 0, 1;``.

    Checked at parse time with libjpeg's rules plus one more: every bit of every coefficient of
    every component must be sent, since libjpeg accepts incomplete (lossy) scripts.
    """

    __slots__ = ("text", "scans", "name")

    def __init__(self, text: str, name: str | None = None):
        self.text = text
        self.name = name  # the preset's name; None for a script from a file
        # (components, Ss, Se, Ah, Al)
        self.scans: tuple[tuple[tuple[int, ...], int, int, int, int], ...] = tuple(_parse_scans(text))

    @classmethod
    def load(cls, path: str | Path) -> "ScanScript":
        """A script from a file; a missing or unreadable file, or one that is not text, is one clear line."""
        try:
            data = read_regular(path, limit=1 << 20)
        except OSError as err:
            raise FanfsError(f"cannot read scan script {path}: {err.strerror}") from None
        try:
            return cls(data.decode("utf-8"))
        except UnicodeDecodeError:
            raise FanfsError(f"scan script {path} is not a text file") from None

    @property
    def components(self) -> int:
        """Number of image components the script codes."""
        return 1 + max(c for comps, *_ in self.scans for c in comps)

    def fitted(self, ncomp: int) -> "ScanScript":
        """The same progression for an image of ``ncomp`` components: components the image lacks are
        dropped (grayscale under a colour script), components the script lacks follow its last one
        (CMYK under a YCbCr script). Each component's progression is independent of the others'."""
        have = self.components
        if ncomp == have:
            return self
        extra = list(range(have, ncomp))
        lines = []
        for comps, ss, se, ah, al in self.scans:
            kept = [c for c in comps if c < ncomp] + (extra if have - 1 in comps else [])
            groups = [kept[i:i + 4] for i in range(0, len(kept), 4)] if ss == 0 else [[c] for c in kept]
            lines.extend(f"{' '.join(map(str, group))}: {ss} {se} {ah} {al};" for group in groups)
        return ScanScript("\n".join(lines) + "\n", self.name)

    def __len__(self) -> int:
        return len(self.scans)

    def __repr__(self) -> str:
        return f"ScanScript({self.name or 'file'}: {len(self.scans)} scans, {self.components} components)"


LIBJPEG = "libjpeg"
"""libjpeg's own progression (``jpeg_simple_progression``: 10 scans for colour), made in-process by
tjTransform; fanfs's default before the presets, so most older stores hold it."""

PRESETS = {
    # Fewest bytes at mean SSIM >= 0.95 in the survey (docs/fidelity.rst): luma at half precision (Al=1) after a
    # half-precision DC is the 0.95 state in 2 scans; refinement scans, which cost decode time, come last.
    "compact": """\
0 1 2: 0 0 0 1;   # DC, all but the lowest bit
0: 1 63 0 1;      # luma AC, all but the lowest bit   <- K=2: SSIM ~0.95
1: 1 63 0 0;      # Cb AC
2: 1 63 0 0;      # Cr AC
0 1 2: 0 0 1 0;   # DC, lowest bit
0: 1 63 1 0;      # luma AC, lowest bit
""",
    # Fastest decode: spectral selection only (no refinement scan); chroma 1-9 before the luma scan
    # that crosses SSIM 0.95 so that libjpeg-turbo's block smoothing is off at that K.
    "fast": """\
0 1 2: 0 0 0 0;   # DC
1: 1 9 0 0;       # Cb AC 1-9
2: 1 9 0 0;       # Cr AC 1-9
0: 1 20 0 0;      # luma AC 1-20   <- K=4: SSIM ~0.95
0: 21 63 0 0;     # luma AC 21-63
1: 10 63 0 0;     # Cb AC 10-63
2: 10 63 0 0;     # Cr AC 10-63
""",
}
"""Named scan scripts for YCbCr; :meth:`ScanScript.fitted` adapts them to grayscale and CMYK images."""

DEFAULT_SCANS = "compact"
SCAN_CHOICES = (*PRESETS, LIBJPEG)


def scan_script(choice: str) -> ScanScript | None:
    """``pack --scan-script``: a preset, ``libjpeg`` (None: the transcoder's own progression) or a file."""
    if choice == LIBJPEG:
        return None
    if choice in PRESETS:
        return ScanScript(PRESETS[choice], choice)
    if not os.path.lexists(choice):
        raise FanfsError(f"cannot read scan script {choice}: No such file or directory "
                         f"(name a file, or a preset: {', '.join(SCAN_CHOICES)})")
    return ScanScript.load(choice)


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
