"""The ``fanfs`` command: pack a dataset once, mount it read-only anywhere, feed training from it.

Errors a user can act on are one line (``fanfs: error: ...``) and exit 1; a bad option exits 2, a
Ctrl-C 130, and a closed pipe (``fanfs info --json | head``) ends the command quietly like any Unix
tool.  Nothing heavy is imported before the error handling is in place.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from types import FrameType
from typing import TYPE_CHECKING

from .. import __version__
from ..errors import FanfsError

if TYPE_CHECKING:
    import argparse

DESCRIPTION = """\
fanfs packs a dataset tree once into a store (compressed shards + one global index) and mounts it
read-only through FUSE, so unmodified training code reads plain POSIX files from node-local storage.

typical use:
  fanfs pack ~/imagenet /scratch/imagenet.fanfs --progressive-jpeg
  fanfs mount /scratch/imagenet.fanfs /tmp/imagenet --fidelity auto:0.95
  python train.py --data /tmp/imagenet
  fanfs umount /tmp/imagenet

model weights and arrays (.npy, safetensors) at a chosen precision:
  fanfs pack ~/models /scratch/models.fanfs --float-records
  fanfs mount /scratch/models.fanfs /tmp/models --precision 16
"""


def build_parser() -> "argparse.ArgumentParser":
    import argparse

    from . import inspect, job, pack, run, serve
    from .args import Parser
    parser = Parser(prog="fanfs", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"fanfs {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, func: Callable[["argparse.Namespace"], int], help_text: str) -> "argparse.ArgumentParser":
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(func=func)
        return p

    pack.add_commands(command)
    serve.add_commands(command)
    inspect.add_commands(command)
    job.add_commands(command)
    run.add_commands(command)
    return parser


def one_line(err: BaseException) -> str:
    """The message of an error, on one line; an OSError as ``file: reason`` rather than ``[Errno N] ...``."""
    if isinstance(err, OSError) and not isinstance(err, FanfsError) and err.strerror:
        where = err.filename if err.filename is not None else None
        text = f"{os.fsdecode(where)}: {err.strerror}" if where is not None else err.strerror
    else:
        text = str(err) or type(err).__name__
    return text.splitlines()[0]


def main(argv: Sequence[str] | None = None) -> int:
    from .supervise import leave
    code = _main(argv)
    leave(code)  # a supervised command whose store stalled: its status said, now
    return code


def _main(argv: Sequence[str] | None) -> int:
    import signal
    interrupts: list[int] = []

    def interrupt(signum: int, frame: FrameType | None) -> None:
        if frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
            # Inside the import machinery (a module lock's weakref callback), an exception is printed
            # as "Exception ignored" and lost: deliver the Ctrl-C again in a millisecond, once out of
            # it (SIGALRM comes back here).  Not raise_signal(): its handler runs at once, still inside.
            signal.setitimer(signal.ITIMER_REAL, 0.001)
            return
        interrupts.append(signum)
        raise KeyboardInterrupt

    try:  # before the handlers: a Ctrl-C just after the first one is installed lands in this try too
        signal.signal(signal.SIGINT, interrupt)  # from here on a Ctrl-C is a KeyboardInterrupt
        signal.signal(signal.SIGALRM, interrupt)  # a Ctrl-C deferred out of the import machinery
        args = build_parser().parse_args(argv)
        if getattr(args, "supervised", None) is not None and args.supervised(args):
            from .supervise import supervise
            status = supervise()
            if status is not None:  # the parent: the command ran in the child
                return status
        code = args.func(args)
        sys.stdout.flush()  # here, not at exit: a closed pipe is then handled below
        return code
    except KeyboardInterrupt:
        return _interrupted()
    except (ImportError, RuntimeError):
        # a Ctrl-C inside an extension's import (numpy's) comes out as an ImportError, and one while a
        # class body is set up (a dataclass field's __set_name__) as a RuntimeError
        if interrupts:
            return _interrupted()
        raise
    except BrokenPipeError:
        # the reader went away (``| head``): say nothing, and keep the interpreter's final flush quiet too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except (FanfsError, ValueError, OSError) as err:
        if not getattr(err, "said_elsewhere", False):
            print(f"fanfs: error: {one_line(err)}", file=sys.stderr)
        return 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)  # the command is over: no deferred Ctrl-C after it


def _interrupted() -> int:
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean exit short
    print("fanfs: interrupted; nothing was left half-done", file=sys.stderr)
    return 130
