"""Names inside archives, made into paths of the tree being packed, or refused with the reason.

An archive names its members with any bytes.  ``./a//b/`` is ``a/b``; a name that is absolute or has a
``..`` component would land outside the tree when extracted, so it is refused (as GNU tar refuses to extract
it without ``-P``); so is one with a NUL byte, a component longer than a file name can be (255 bytes), or a
whole path longer than Linux opens (4,095 bytes: "File name too long", as GNU tar says of it).
"""

from __future__ import annotations

from .members import IngestError

NAME_MAX = 255
PATH_MAX = 4095  # bytes of a path, its NUL not counted (Linux's PATH_MAX is 4,096 with it)
SHOWN = 200  # bytes of a name a message shows at most
ARCHIVE_SUFFIXES = (b".tar", b".tar.gz", b".tgz", b".tar.bz2", b".tbz", b".tbz2", b".tar.xz", b".txz", b".tar.zst",
                    b".tzst", b".zip")
"""What ``--expand-archives`` expands, by name (so that a ``.npz``, a zip inside, stays a file)."""


def show(name: bytes) -> str:
    """A name as a message shows it: text where it is UTF-8, escapes where it is not or where it is not printable
    (a message stays one line, and short: a longer name shows its start and its length)."""
    if len(name) > SHOWN:
        return f"{show(name[:SHOWN])}...({len(name):,} bytes)"
    text = name.decode("utf-8", "backslashreplace")
    return text if text.isprintable() else repr(text)[1:-1]


def member_path(raw: bytes, where: str) -> bytes:
    """The tree path of the archive member named ``raw`` (``b""``: the archive's root, as ``./`` names it)."""
    name = raw[2:] if raw.startswith(b"./") else raw
    if (len(name) <= NAME_MAX and b"\0" not in name and b".." not in name and b"//" not in name and b"/./" not in name
            and not name.startswith((b"/", b"./")) and not name.endswith((b"/", b"/.")) and name not in (b"", b".")):
        return name  # most names: already a clean relative path (every component of it at most NAME_MAX bytes)
    if b"\0" in raw:
        raise IngestError(f"{where}: member {show(raw)} has a NUL byte in its name: fanfs cannot present it")
    if raw.startswith(b"/"):
        raise IngestError(f"{where}: member {show(raw)} has an absolute name, which would be extracted outside "
                          "the archive's directory: fanfs packs only relative names (repack the archive without it)")
    parts = [part for part in raw.split(b"/") if part and part != b"."]
    if b".." in parts:
        raise IngestError(f"{where}: member {show(raw)} has a '..' in its name, which would be extracted outside "
                          "the archive's directory: fanfs refuses such archives (repack it without that member)")
    for part in parts:
        if len(part) > NAME_MAX:
            raise IngestError(f"{where}: member {show(raw)} has a name component of {len(part)} bytes, more than "
                              f"the {NAME_MAX} a file name may have")
    return b"/".join(parts)


def expanded_name(path: bytes) -> bytes | None:
    """The directory an archive member at ``path`` expands to (its name without the archive suffix), or None
    if its name is not an archive's."""
    lower = path.lower()
    for suffix in sorted(ARCHIVE_SUFFIXES, key=len, reverse=True):
        if lower.endswith(suffix) and len(path) > len(suffix) and path[-len(suffix) - 1:-len(suffix)] != b"/":
            return path[:-len(suffix)]
    return None


def join(prefix: bytes, path: bytes) -> bytes:
    return prefix + b"/" + path if prefix and path else prefix or path
