"""Progressive scan scripts in jpegtran's ``-scans`` format, validated so that only lossless ones pass."""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import FanfsError
from ..util.files import read_regular
from .jpegfile import JpegError

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
