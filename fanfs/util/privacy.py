"""How private what fanfs writes must be: no more readable by other users than the data it comes from.

Another user reads a file only if its mode lets their class (group or other) read it and every directory
above it lets them search it.  What fanfs writes from a store or a source (a pack's store, staged copies,
spill files) gets the read bits the original grants through that whole path, never more: a 0700 store, or a
0755 one in a 0700 home, gives 0600 files and 0700 directories, wherever they are written (a ``--local-dir``
made with a plain ``mkdir`` included); and a copy keeps the group's read bit only where it has the original's group
(:func:`read_bits_in`).  Owners keep read and write; nothing is ever made wider than the
umask already makes it.  (ACLs are not read: a store shared only through an ACL gives private copies.)
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable

_CLASSES = ((stat.S_IRGRP, stat.S_IXGRP), (stat.S_IROTH, stat.S_IXOTH))


def readable_by_others(path: str) -> int:
    """The read bits (``S_IRGRP``, ``S_IROTH``) of the classes that can read ``path`` (a directory: list and
    enter it) through every directory above it; 0 if it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return 0
    bits = 0
    for read, search in _CLASSES:
        if st.st_mode & read and (not stat.S_ISDIR(st.st_mode) or st.st_mode & search):
            bits |= read
    here = os.path.abspath(path)
    while bits and (parent := os.path.dirname(here)) != here:
        here = parent
        try:
            above = os.stat(here)
        except OSError:
            return 0
        if not above.st_mode & stat.S_IXOTH:
            bits &= ~stat.S_IROTH
            if not (above.st_mode & stat.S_IXGRP and above.st_gid == st.st_gid):  # the file's group, not another
                bits &= ~stat.S_IRGRP
    return bits


def read_bits_in(path: str, directory: str) -> int:
    """The read bits a copy of ``path`` written in ``directory`` may have: :func:`readable_by_others`, but the group's
    only where the copy gets the original's group (a new file takes its creator's group, or a setgid directory's) or
    everyone may read it: in the creator's own group, a copy would be open to users that the original's group shuts
    out."""
    bits = readable_by_others(path)
    if bits & stat.S_IRGRP and not bits & stat.S_IROTH:
        try:
            above, original = os.stat(directory), os.stat(path)
        except OSError:
            return bits & ~stat.S_IRGRP
        if (above.st_gid if above.st_mode & stat.S_ISGID else os.getegid()) != original.st_gid:
            bits &= ~stat.S_IRGRP
    return bits


def shared_read_bits(paths: Iterable[str]) -> int:
    """The read bits every one of ``paths`` grants (see :func:`readable_by_others`)."""
    bits = stat.S_IRGRP | stat.S_IROTH
    for path in paths:
        bits &= readable_by_others(path)
    return bits


def file_mode(read_bits: int) -> int:
    """The mode to create a file with: the owner's read and write, and ``read_bits`` for the others."""
    return 0o600 | read_bits


def narrow_umask(read_bits: int) -> int:
    """Make this process (and what it forks) create nothing readable, listable or enterable by a class that
    ``read_bits`` leaves out, nor writable by anyone else; what the umask closed stays closed.  Returns the new
    umask if it is narrower than the old one (the caller says so: a store more private than the user's umask
    makes things), else 0."""
    old = os.umask(0)
    new = old | (0o077 & ~(read_bits | read_bits >> 2))
    os.umask(new)
    return new if new & 0o044 & ~old else 0
