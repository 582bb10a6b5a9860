"""An older kernel for this process and every process it starts: named system calls fail with ENOSYS, as on a kernel
that predates them (RHEL 8's 4.18 and RHEL 9's 5.14 have no ``cachestat``), by a seccomp filter the kernel applies
whatever route the call takes (ctypes, libc, a C extension).

Installed without ``no_new_privs`` when the process may (root: CAP_SYS_ADMIN), so that a setuid ``fusermount3`` still
works for a process that drops to another user after this (tests/support/run_as_nobody.py).
"""

from __future__ import annotations

import ctypes
import errno
import os

CALLS = {  # name -> number, by architecture
    "x86_64": {"cachestat": 451, "mincore": 27, "preadv2": 327, "pidfd_open": 434},
    "aarch64": {"cachestat": 451, "mincore": 232, "preadv2": 286, "pidfd_open": 434},
}
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_LD_W_ABS, _JEQ_K, _RET_K = 0x20, 0x15, 0x06


class _Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_Filter))]


def deny(*names: str) -> None:
    """Make each named call fail with ENOSYS from now on, in this process and its children."""
    machine = os.uname().machine
    numbers = [CALLS[machine][name] for name in names]
    code = [_Filter(_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
            _Filter(_JEQ_K, 0, len(numbers) + 1, _AUDIT_ARCH[machine]),  # another architecture's call: allowed
            _Filter(_LD_W_ABS, 0, 0, 0)]  # seccomp_data.nr
    for i, number in enumerate(numbers):
        code.append(_Filter(_JEQ_K, len(numbers) - i, 0, number))  # to the ENOSYS return below
    code += [_Filter(_RET_K, 0, 0, _RET_ALLOW), _Filter(_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS)]
    program = _Program(len(code), (_Filter * len(code))(*code))
    libc = ctypes.CDLL(None, use_errno=True)
    if os.geteuid() != 0 and libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")
