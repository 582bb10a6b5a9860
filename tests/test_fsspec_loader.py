"""Issue 22: a real PyTorch DataLoader (torch 2.13.0, CPU) with 4 worker processes reads a store in-process.

The dataset is docs/fsspec.rst's ImageFolder over the fsspec file system; every image a worker returns is
compared, pixel for pixel, with the original photo decoded by Pillow.  The file system is opened
before the fork (docs/fsspec.rst's advice), in each worker, and across a fork taken while another thread
held the store's locks; under ``spawn`` it travels by its arguments.
"""

from __future__ import annotations

import io
from pathlib import Path

import fsspec
import numpy as np
import pytest
from fanfs_command import fanfs
from photo_samples import make_photo_set
from PIL import Image

from fanfs.fsspec import FanfsFileSystem  # registers the protocol where the entry point is not installed

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")  # on 2 cores: meant

CLASSES, PER_CLASS = 4, 10


class StoreImageFolder(torch.utils.data.Dataset):
    """docs/fsspec.rst's example: one folder per class in a fanfs store, read in-process (no mount)."""

    def __init__(self, store: str, root: str = "", transform=None, **presentation) -> None:
        self.fs = fsspec.filesystem("fanfs", store=store, **presentation)  # before the DataLoader forks
        classes = sorted(entry["name"] for entry in self.fs.ls(root) if entry["type"] == "directory")
        self.samples = [(path, label) for label, c in enumerate(classes) for path in self.fs.find(c)]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, label = self.samples[i]
        image = Image.open(io.BytesIO(self.fs.cat_file(path))).convert("RGB")
        return (self.transform(image) if self.transform else image), label


class OpenedInEachWorker(StoreImageFolder):
    """The other way: each worker opens its own file system (fsspec's instance cache is per process)."""

    def __getitem__(self, i: int):
        path, label = self.samples[i]
        fs = fsspec.filesystem("fanfs", store=self.fs.store.root)
        with Image.open(fs.open(path)) as image:
            return to_pixels(image.convert("RGB")), label


def to_pixels(image: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.asarray(image).copy())


@pytest.fixture(scope="module")
def photo_stores(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    base = tmp_path_factory.mktemp("loader")
    for c in range(CLASSES):
        make_photo_set(base / "src" / f"class{c}", PER_CLASS, seed=10 + c)
    fanfs("pack", base / "src", base / "plain", "--quiet")
    fanfs("pack", base / "src", base / "progressive", "--progressive-jpeg", "--quiet")
    return base / "src", {"plain": str(base / "plain"), "progressive": str(base / "progressive")}


def read_all(dataset: StoreImageFolder, src: Path, **loader_options) -> None:
    """Every item through a DataLoader, each checked against the original photo's pixels and its class."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, shuffle=False, timeout=60, **loader_options)
    count = 0
    for (path, label), (pixels, got) in zip(dataset.samples, loader):
        with Image.open(src / path) as original:
            assert np.array_equal(pixels.numpy(), np.asarray(original.convert("RGB"))), path
        assert got == label == int(path.split("/")[0][len("class"):])
        count += 1
    assert count == CLASSES * PER_CLASS


@pytest.mark.parametrize("which", ["plain", "progressive"])
def test_four_workers_forked_after_the_fs_was_opened(photo_stores, which):
    dataset = StoreImageFolder(photo_stores[1][which], transform=to_pixels)
    assert isinstance(dataset.fs, FanfsFileSystem)
    read_all(dataset, photo_stores[0], num_workers=4, multiprocessing_context="fork")


def test_four_workers_each_opening_their_own(photo_stores):
    dataset = OpenedInEachWorker(photo_stores[1]["progressive"])
    read_all(dataset, photo_stores[0], num_workers=4, multiprocessing_context="fork")


def test_a_fork_while_another_thread_holds_the_store_locks(photo_stores):
    """A worker forked while a thread of the parent is inside the store's cache or opening a shard inherits
    those locks held: without renewing them after the fork, its first read never returns."""
    dataset = StoreImageFolder(photo_stores[1]["plain"], transform=to_pixels, skip_instance_cache=True)
    store = dataset.fs.store
    with store.cache._lock, store.sources[0]._lock:
        loader = iter(torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=4, timeout=60,
                                                  multiprocessing_context="fork"))
    first, label = next(loader)
    path = dataset.samples[0][0]
    with Image.open(photo_stores[0] / path) as original:
        assert np.array_equal(first.numpy(), np.asarray(original.convert("RGB")))
    assert sum(1 for _ in loader) == len(dataset) - 1
    del loader


@pytest.mark.slow  # the quick subset's time (its promise keeps a quicker test)
def test_spawned_workers_open_the_store_from_its_arguments(photo_stores):
    dataset = StoreImageFolder(photo_stores[1]["progressive"], transform=to_pixels, fidelity="full")
    read_all(dataset, photo_stores[0], num_workers=2, multiprocessing_context="spawn")
    assert dataset.fs.stats()["reads"] == 0  # every read was a worker's, through its own copy
