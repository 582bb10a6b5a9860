"""The ``fanfs`` command.  This package init is all that runs before the entry point below."""

import os
import signal
import sys


def _interrupted_while_starting(signum: int, frame: object) -> None:
    os.write(2, b"fanfs: interrupted; nothing was left half-done\n")  # the same line as main's: nothing began
    os._exit(130)


def entry() -> None:
    """The ``fanfs`` executable.

    A Ctrl-C while the command's modules are still being imported exits quietly (130); ``main`` then
    handles it (and every error) itself.  Once the command is over, a Ctrl-C could only cut the
    interpreter's own shutdown short (CPython restores the default SIGINT action for it), turning a
    finished command's status into "killed": so it is ignored from then on.

    A KeyboardInterrupt leaving code that ``exec()`` runs from a string (dataclasses and multiprocessing
    build methods so while the command imports them) makes CPython mark it unhandled, however it is
    handled later; ``python -m`` then kills itself with SIGINT at exit instead of returning the status.
    Running a string that raises nothing clears that mark: once ``main`` returns, nothing is unhandled.
    """
    try:
        signal.signal(signal.SIGINT, _interrupted_while_starting)
    except KeyboardInterrupt:  # it landed just before our handler took over
        _interrupted_while_starting(signal.SIGINT, None)
    from ..errors import shadowing_folder
    problem = shadowing_folder()
    if problem is not None:  # python -m fanfs beside a folder named fanfs: say so, not a traceback about __version__
        os.write(2, f"fanfs: error: {problem}\n".encode())
        sys.exit(1)
    from .main import main
    code = main()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exec("")  # noqa: S102 - an empty string: clears a stale "unhandled KeyboardInterrupt" (see above)
    sys.exit(code)
