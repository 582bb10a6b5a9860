"""fanfs for fsspec: a store read in-process through ``fsspec.filesystem("fanfs", store=PATH)``.

The in-process front, a sibling of the FUSE front (:mod:`fanfs.serve`): the only package that imports
fsspec (``import fanfs`` and the command line never do).  fsspec finds it by the ``fsspec.specs`` entry
point; importing this package registers the protocol too (a checkout on ``PYTHONPATH`` has no entry point).
"""

from ..errors import refuse_a_shadowed_package

refuse_a_shadowed_package()  # before anything of the package is imported

import fsspec

from .filesystem import PROTOCOL, FanfsFileSystem, ReadOnlyError

fsspec.register_implementation(PROTOCOL, FanfsFileSystem, clobber=True)

__all__ = ["FanfsFileSystem", "ReadOnlyError"]
