"""Started by Python at the start of every process of a command run under ``fanfs run``: this directory is put first
on ``PYTHONPATH``, as ``opentelemetry-instrument`` and ``ddtrace-run`` do, so that spawned workers and any Python the
command starts get the in-process reads too (a forked process has them already).

It must never break the program: if fanfs cannot be imported in this Python (another environment), or anything else
fails, one line says so (once per command) and every open goes to the mount as without ``fanfs run``.  Then the next
``sitecustomize`` on the path, if any (the site's or the user's), runs as it would have.
"""

import os
import sys


def _start() -> None:
    if not os.environ.get("FANFS_RUN_MOUNTS"):
        return
    try:
        from fanfs.errors import shadowing_folder
        problem = shadowing_folder()
        if problem is None:
            from fanfs.inproc.hook import install_from_environment
            install_from_environment()
    except Exception as err:  # noqa: BLE001 - whatever it is, the program runs on, through the mount
        problem = f"{type(err).__name__}: {err}"
    if problem is not None and not os.environ.get("FANFS_RUN_SAID"):
        os.environ["FANFS_RUN_SAID"] = "1"  # its children say nothing more
        sys.stderr.write(f"fanfs run: in-process reads are off in {sys.executable} (every open goes through the "
                         f"mount): {problem}\n")


def _next_sitecustomize() -> None:
    """Run the sitecustomize that this one hides, if there is one further on the path."""
    import importlib.machinery
    import importlib.util
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [entry for entry in sys.path if os.path.abspath(entry or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_start()
_next_sitecustomize()
