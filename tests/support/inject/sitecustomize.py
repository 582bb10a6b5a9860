"""Faults injected into a fanfs process a test starts (a daemon, a rank), from the test, never from production code.

Python imports ``sitecustomize`` at start-up from ``sys.path``: a test puts this directory first on ``PYTHONPATH`` and
names what to change in ``FANFS_TEST_INJECT``, ``;``-separated ``module:NAME=EXPRESSION`` items (support/inject.py
writes both): each module is imported and its attribute ``NAME`` (dotted: an attribute of one of its names) set to the
expression's value, evaluated among the module's names and ``faults`` (fanfs_faults.py), before fanfs runs.

    fanfs.serve.lowlevel:Session.invalidate_entry=faults.pausing(Session.invalidate_entry, 0.003)
                                                    a slow kernel's invalidations
    fanfs.cache.localcache:os.pwrite=faults.half_written(os.pwrite, 60)
                                                    a fill that waits with half its copy written
    fanfs.serve.splice:pipe_max_size=lambda: 4096   a site whose pipes are one page

and, in ``FANFS_TEST_ENOSYS``, the system calls (``,``-separated names) that fail with ENOSYS in the process and all it
starts: an older kernel (enosys.py).
"""

import functools
import importlib
import os

import fanfs_faults as faults

if os.environ.get("FANFS_TEST_ENOSYS"):
    import enosys

    enosys.deny(*os.environ["FANFS_TEST_ENOSYS"].split(","))

for item in filter(None, os.environ.get("FANFS_TEST_INJECT", "").split(";")):
    target, _, expression = item.partition("=")
    module_name, _, name = target.partition(":")
    module = importlib.import_module(module_name)
    *path, attribute = name.split(".")
    owner = functools.reduce(getattr, path, module)
    value = eval(expression, {**vars(module), "faults": faults})  # noqa: S307 - a test's own expression
    setattr(owner, attribute, value)
