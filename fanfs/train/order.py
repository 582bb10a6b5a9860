"""A sampler that tells the mount the order it will read in, so that the mount reads ahead of it.

A training's order is known before it reads: a seeded shuffle per epoch.  :class:`OrderSampler` wraps the sampler
a ``DataLoader`` would use (``DistributedSampler`` for a job of several ranks; by default a seeded shuffle of the
whole dataset) and, as each epoch begins, gives the mount the paths of that epoch and, where the sampler can say it
(``set_epoch``), of the next, through the mount's control socket (``fanfs ctl --order`` takes the same file).  A
mount of any kind then has the next files' blobs read ahead before the loader's workers open them: into the page
cache from the node's copies or the store (:mod:`fanfs.cache.pagecache`, within ``--prefetch``), or on a lazily
staged node into its cache from its peers or the shared store (:mod:`fanfs.cache.prefetch`).  The indices it yields
are the wrapped sampler's, unchanged; if the mount cannot take the order (``--prefetch 0``, or gone), training goes
on, with one warning.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..errors import FanfsError
from ..serve.control import request
from ..util.runtime import create_private, runtime_dir

log = logging.getLogger("fanfs")


def dataset_paths(dataset: Any) -> Callable[[int], str]:
    """Index -> path for a dataset of files: a sequence of paths, or a dataset that lists its ``(path, target)``
    pairs in ``samples`` or ``imgs`` (torchvision's ``ImageFolder`` and ``DatasetFolder``) or ``items``."""
    for name in ("samples", "imgs", "items"):
        pairs = getattr(dataset, name, None)
        if isinstance(pairs, Sequence) and pairs and isinstance(pairs[0], tuple):
            return lambda i: os.fspath(pairs[i][0])
    if isinstance(dataset, Sequence) and not isinstance(dataset, (str, bytes)):
        return lambda i: os.fspath(dataset[i])
    raise FanfsError("OrderSampler needs the dataset's paths: a dataset with 'samples' (ImageFolder) or a list of "
                     "paths (paths=)")


def the_mountpoint(mountpoint: str | os.PathLike | None) -> str:
    """The mount a sampler tells its order: ``mountpoint``, else ``$FANFS_MNT``; one line if neither is given."""
    mountpoint = mountpoint or os.environ.get("FANFS_MNT")
    if not mountpoint:
        raise FanfsError("a sampler that tells the mount its order needs the mount point: mountpoint= or $FANFS_MNT")
    return os.path.abspath(os.fspath(mountpoint))


class OrderSampler:
    """Yields the indices of ``sampler`` (default: a seeded shuffle of ``dataset``, ``DistributedSampler``'s) and tells
    the mount at ``mountpoint`` (default ``$FANFS_MNT``) the paths they stand for, one epoch ahead where it can.

    ``paths``: the dataset's files by index, if the dataset does not list them (:func:`dataset_paths`).
    ``stream``: the name this reader's order goes by on the node (default: this process's pid; each training
    process of a node that reads its own share tells its own).
    """

    def __init__(self, dataset: Any, sampler: Any = None, *, mountpoint: str | os.PathLike | None = None,
                 paths: Sequence[str] | None = None, seed: int = 0, stream: str | None = None) -> None:
        self.path_of = dataset_paths(paths if paths is not None else dataset)
        self.mountpoint = the_mountpoint(mountpoint)
        if sampler is None:
            from torch.utils.data import DistributedSampler
            sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=seed)
        self.sampler = sampler
        self.stream = stream or f"pid{os.getpid()}"
        self.epoch = 0
        self._quiet = False  # the mount refused once: training goes on without telling it

    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        indices = list(self.sampler)
        epochs = [indices]
        if hasattr(self.sampler, "set_epoch"):  # the next epoch's order too: the node reads on across the boundary
            self.sampler.set_epoch(self.epoch + 1)
            epochs.append(list(self.sampler))
            self.sampler.set_epoch(self.epoch)
        self.tell(epochs)
        return iter(indices)

    def tell(self, epochs: list[list[int]]) -> dict[str, Any] | None:
        """Give the mount the paths of ``epochs`` (lists of indices); its answer, or None if it took none."""
        if self._quiet:
            return None
        path = os.path.join(runtime_dir(), f"order-{os.getpid()}-{id(self):x}")
        fd = create_private(path)
        try:
            with os.fdopen(fd, "wb") as f:  # a path at a time (an epoch of ImageNet-22k's is 1.2 GB)
                for epoch in epochs:
                    f.writelines(os.fsencode(self.path_of(i)) + b"\n" for i in epoch)
                    f.write(b"\n")
            return request(self.mountpoint, {"cmd": "order", "path": path, "stream": self.stream}, timeout=600,
                           needs=("files",))
        except (FanfsError, OSError) as err:
            self._quiet = True
            log.warning("fanfs: %s did not take the order of the coming reads (%s): reading on without fetching "
                        "ahead", self.mountpoint, err)
            return None
        finally:
            os.unlink(path)
