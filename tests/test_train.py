"""Issue 13.3: fidelity chosen by the training (PyTorch 2.13.0, CPU), through a real mount of real photos.

A tiny CNN reads an ImageFolder-style dataset (PIL open + convert('RGB'), random crop, to tensor) through
an unmodified DataLoader with worker processes.  PCR's gradient test picks a K and switches the mount,
which ``fanfs stats`` shows, and the next epoch reads only the layers below K; the choice leaves the
model, its gradients and the random state as they were; a fidelity schedule raises K as the loss
plateaus; bad inputs are one line.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from fanfs_command import fanfs, mount_stats, stats_command as stats
from photo_samples import make_photo_set

from fanfs.errors import FanfsError, UsageError
from fanfs.records import FULL
from fanfs.serve.control import request
from fanfs.store import Store

torch = pytest.importorskip("torch")

from photo_folder import PhotoFolder  # noqa: E402

from fanfs.train import OrderSampler, choose_fidelity, fidelity_levels, fidelity_schedule  # noqa: E402

pytestmark = pytest.mark.slow  # see docs/userguide.rst, 'Quick start'

CLASSES, PER_CLASS, CROP = 4, 12, 32


def photos(root: Path) -> PhotoFolder:
    """What a user writes (tools/support/photo_folder.py), at this test's crop."""
    return PhotoFolder(root, CROP)


def tiny_cnn() -> torch.nn.Module:
    """Batch norm and dropout included: both behave differently in training mode."""
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(), torch.nn.Dropout(0.25),
                               torch.nn.Linear(128, CLASSES))


@pytest.fixture(scope="module")
def photo_store(tmp_path_factory):
    base = tmp_path_factory.mktemp("train")
    for c in range(CLASSES):
        make_photo_set(base / "src" / f"class{c}", PER_CLASS, seed=c)
    # libjpeg's 10 scans, not the compact default's 6: the schedule's byte steps then fall on distinct Ks
    fanfs("pack", base / "src", base / "store", "--scan-script", "libjpeg", "--quiet")
    return base / "store"


def train_epoch(model, loader, optimiser) -> float:
    model.train()
    total = 0.0
    for x, y in loader:
        optimiser.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimiser.step()
        total += loss.item() * len(x)
    return total / len(loader.dataset)


def layers_read(before: dict, after: dict) -> list[int]:
    """Bytes read from storage per layer between two stats answers."""
    old, new = before["stored_by_layer"], after["stored_by_layer"]
    return [b - (old[i] if i < len(old) else 0) for i, b in enumerate(new)]


def snapshot(model) -> dict:
    return {"state": {k: v.clone() for k, v in model.state_dict().items()},
            "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
            "modes": [m.training for m in model.modules()],
            "rng": (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())}


def assert_same(a: dict, b: dict) -> None:
    assert a["state"].keys() == b["state"].keys()
    assert all(torch.equal(a["state"][k], b["state"][k]) for k in a["state"]), "weights or running statistics changed"
    assert len(a["grads"]) == len(b["grads"])
    for g, h in zip(a["grads"], b["grads"]):
        assert (g is None and h is None) or (g is not None and h is not None and torch.equal(g, h)), "gradients changed"
    assert a["modes"] == b["modes"]
    assert torch.equal(a["rng"][0], b["rng"][0]) and a["rng"][1] == b["rng"][1] and np.array_equal(a["rng"][2], b["rng"][2])


def test_gradient_choice_switches_the_mount_and_training_reads_fewer_layers(photo_store, mount):
    torch.manual_seed(0)
    random.seed(0)
    with mount(photo_store) as mnt:
        dataset = photos(mnt)
        loader = torch.utils.data.DataLoader(dataset, batch_size=16, shuffle=True, num_workers=2, persistent_workers=True)
        try:
            model = tiny_cnn()
            optimiser = torch.optim.SGD(model.parameters(), lr=0.05)
            train_epoch(model, loader, optimiser)  # a few steps at full fidelity
            optimiser.zero_grad()
            model.eval()  # whatever mode the caller left: it comes back
            before = snapshot(model)
            choice = choose_fidelity(model, torch.nn.functional.cross_entropy, dataset, mnt, batches=2, batch_size=16,
                                     num_workers=2)
            assert_same(before, snapshot(model))  # no step, no .grad, running stats, modes and RNG as they were
            assert all(p.grad is None for p in model.parameters())
            print(choice)
            ks = list(choice.similarity)
            assert choice.fidelity != FULL and ks == list(range(1, choice.fidelity + 1))  # lowest first, stops at the winner
            assert all(s < 0.8 for s in list(choice.similarity.values())[:-1]) and choice.similarity[choice.fidelity] >= 0.8
            assert choice.images == 32 and str(choice).startswith(f"fidelity {choice.fidelity}: ")
            read_before = stats(mnt)
            assert read_before["fidelity"] == str(choice.fidelity)  # the mount switched (fanfs stats says so)
            train_epoch(model, loader, optimiser)  # the same persistent workers, now at K
            per_layer = layers_read(read_before, stats(mnt))
        finally:
            del loader
    print("choice", choice, "per layer", per_layer)
    assert sum(per_layer[:choice.fidelity]) > 0 and not any(per_layer[choice.fidelity:])


class Brighter(torch.utils.data.Dataset):
    """The photos labelled by what a model learns in a few epochs: brighter than the median or not."""

    def __init__(self, data) -> None:
        self.data = data
        means = torch.tensor([float(data[i][0].mean()) for i in range(len(data))])
        self.labels = (means > means.median()).long()

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i][0], self.labels[i]


def test_an_untrained_model_is_warned_about(photo_store, mount):
    """Issue 35: a fresh model picked K=1 (its gradient agrees with full's at any K): the choice warns, naming the
    risk; once the model has learned its task it does not."""
    torch.manual_seed(1)
    with mount(photo_store) as mnt:
        dataset = Brighter(photos(mnt))
        model = tiny_cnn()
        with pytest.warns(UserWarning, match="looks untrained.*choose after some epochs"):
            fresh = choose_fidelity(model, torch.nn.functional.cross_entropy, dataset, mnt, batches=2, batch_size=16,
                                    switch=False)
        assert fresh.learned > 0.9
        loader = torch.utils.data.DataLoader(dataset, batch_size=16, shuffle=True)
        optimiser = torch.optim.Adam(model.parameters(), lr=0.01)
        for _ in range(10):
            train_epoch(model, loader, optimiser)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            trained = choose_fidelity(model, torch.nn.functional.cross_entropy, dataset, mnt, batches=2,
                                      batch_size=16, switch=False)
        assert trained.learned < 0.9, trained.learned
        print(f"loss own/shuffled: fresh {fresh.learned:.2f}, trained {trained.learned:.2f}")


def test_choice_is_deterministic_and_only_fidelity_moves_the_gradient(photo_store, mount):
    """Pinned randomness: dropout and random crops repeat, so equal inputs give exactly the full gradient."""
    torch.manual_seed(1)
    model = tiny_cnn()
    loss = torch.nn.functional.cross_entropy
    with mount(photo_store, "--fidelity", "3") as mnt:
        dataset = photos(mnt)
        first = choose_fidelity(model, loss, dataset, mnt, candidates=[5, 1], threshold=1.0, batches=2,
                                batch_size=8, num_workers=2, switch=False)
        again = choose_fidelity(model, loss, dataset, mnt, candidates=[1, 5], threshold=1.0, batches=2,
                                batch_size=8, num_workers=2, switch=False)  # the same samples, crops and masks
        assert request(mnt, {"cmd": "stats"})["fidelity"] == 3  # switch=False: back where it was
        assert first.similarity == pytest.approx(again.similarity, abs=1e-9)
        assert list(first.similarity) == [1, 5] and first.fidelity == FULL and "none reaches 1.0" in str(first)

        class Constant(torch.utils.data.Dataset):  # reads a file through the mount, ignores its pixels
            def __len__(self):
                return len(dataset)

            def __getitem__(self, i):
                dataset[i]
                return torch.rand(3, CROP, CROP), i % CLASSES

        same = choose_fidelity(model, loss, Constant(), mnt, candidates=[1, 2], threshold=0.999999, batches=2,
                               batch_size=8, num_workers=2)
        assert same.fidelity == 1 and list(same.similarity) == [1] and same.similarity[1] == pytest.approx(1.0, abs=1e-9)
        assert request(mnt, {"cmd": "stats"})["fidelity"] == 1


def test_failed_choice_puts_the_mount_and_model_back(photo_store, mount):
    torch.manual_seed(2)
    model = tiny_cnn()
    calls = []

    def failing_loss(output, target):
        calls.append(1)
        if len(calls) == 3:  # the full pass (2 batches) went through; the first candidate's fails
            raise RuntimeError("loss blew up")
        return torch.nn.functional.cross_entropy(output, target)

    with mount(photo_store, "--fidelity", "4") as mnt:
        before = snapshot(model)
        with pytest.raises(RuntimeError, match="loss blew up"):
            choose_fidelity(model, failing_loss, photos(mnt), mnt, batches=2, batch_size=8, num_workers=2)
        assert request(mnt, {"cmd": "stats"})["fidelity"] == 4
        assert_same(before, snapshot(model))
    assert not mp.active_children()  # the choice's DataLoader workers are gone


def test_schedule_raises_fidelity_as_the_loss_plateaus(photo_store, mount):
    torch.manual_seed(3)
    random.seed(3)
    with mount(photo_store) as mnt:
        levels = fidelity_levels(mnt)
        schedule = fidelity_schedule(mnt, patience=1, min_delta=0.05, relative=True)
        assert schedule.levels == levels and levels[-1] == FULL and len(levels) >= 3
        schedule.start()
        loader = torch.utils.data.DataLoader(photos(mnt), batch_size=16, shuffle=True, num_workers=2,
                                             persistent_workers=True)
        try:
            model = tiny_cnn()
            optimiser = torch.optim.SGD(model.parameters(), lr=0.01)
            seen = []
            for epoch in range(12):
                before = request(mnt, {"cmd": "stats"})
                loss = train_epoch(model, loader, optimiser)
                after = request(mnt, {"cmd": "stats"})
                seen.append((schedule.level, after["fidelity"], layers_read(before, after), loss))
                schedule.step(loss)
                if schedule.done and seen[-1][0] == FULL:
                    break
        finally:
            del loader
        assert stats(mnt)["fidelity"] == "full"  # what 'fanfs stats' shows
    print("levels", levels, "history", schedule.history, "epochs", [(k, round(loss, 4)) for k, _, _, loss in seen])
    assert [k for k, *_ in seen][-1] == FULL and {k for k, *_ in seen} == set(levels)  # every level, up to full
    for level, shown, per_layer, _ in seen:
        assert shown == level  # fanfs stats shows the schedule's level
        if level != FULL:
            assert not any(per_layer[level:]), (level, per_layer)  # nothing above K was read
    for (step, level), (_, previous) in zip(schedule.history[1:], schedule.history):
        assert level > previous and step >= 1


def test_levels_follow_the_bytes(photo_store, mount):
    with mount(photo_store) as mnt:
        levels = fidelity_levels(mnt, fractions=(0.2, 0.5))
        with pytest.raises(UsageError, match="increasing"):
            fidelity_levels(mnt, fractions=(0.5, 0.2))
        with pytest.raises(UsageError, match=r"\(0, 1\)"):
            fidelity_levels(mnt, fractions=(0.5, 1.0))
    store = Store(str(photo_store))
    jpegs = [e for e in range(store.index.entries) if store.index.record[e] == 1 and store.index.type[e] == 1]

    def share(k: int) -> float:
        return sum(store.size_at(e, k) for e in jpegs) / sum(store.size_at(e) for e in jpegs)

    top = int(store.index.layers[jpegs].max())
    smallest = [next((k for k in range(1, top) if share(k) >= fraction), FULL) for fraction in (0.2, 0.5)]
    assert levels == sorted({k for k in smallest if k != FULL}) + [FULL], (levels, smallest)  # the smallest K reaching each
    assert levels[-1] == FULL and levels == sorted(levels)
    store.close()


@pytest.mark.parametrize("kwargs, message", [
    ({"threshold": 0}, "threshold"), ({"threshold": 1.5}, "threshold"), ({"threshold": float("nan")}, "threshold"),
    ({"threshold": True}, "threshold"), ({"threshold": "0.8"}, "threshold"),
    ({"candidates": []}, "no candidate"), ({"candidates": [FULL]}, "no candidate"), ({"candidates": [0]}, "layer counts"),
    ({"candidates": [2.5]}, "layer counts"), ({"batches": 0}, "batches"), ({"batch_size": 1.5}, "batch_size"),
])
def test_bad_arguments_are_one_line_before_anything_is_read(tmp_path, kwargs, message):
    with pytest.raises(UsageError, match=message) as err:
        choose_fidelity(tiny_cnn(), torch.nn.functional.cross_entropy, [], tmp_path, **kwargs)
    assert "\n" not in str(err.value)


def test_bad_mounts_and_candidates_are_one_line(photo_store, tmp_path, mount):
    model = tiny_cnn()
    loss = torch.nn.functional.cross_entropy
    for call in (lambda p: choose_fidelity(model, loss, [], p), lambda p: fidelity_schedule(p),
                 lambda p: fidelity_levels(p)):
        with pytest.raises(UsageError, match="is .* a fanfs mount") as err:
            call(tmp_path)
        assert "\n" not in str(err.value)
    with mount(photo_store, "--fidelity", "2") as mnt:
        for kwargs, message in (({"candidates": [3, 99]}, "out of range: this store's records have at most"),
                                ({}, "dataset is empty")):
            with pytest.raises(UsageError, match=message) as err:
                choose_fidelity(model, loss, [], mnt, **kwargs)
            assert "\n" not in str(err.value)
        with pytest.raises(UsageError, match="no parameter"):
            choose_fidelity(torch.nn.ReLU(), loss, photos(mnt), mnt)

        class Stream(torch.utils.data.IterableDataset):
            def __iter__(self):
                return iter(photos(mnt))

        with pytest.raises(UsageError, match="map-style"):
            choose_fidelity(model, loss, Stream(), mnt)
        assert request(mnt, {"cmd": "stats"})["fidelity"] == 2  # refused before any switch
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("no photos here")
    fanfs("pack", tmp_path / "src", tmp_path / "store", "--quiet")
    with mount(tmp_path / "store") as mnt:
        with pytest.raises(FanfsError, match="no progressive JPEG records") as err:
            choose_fidelity(model, loss, [], mnt)
        assert "\n" not in str(err.value)


def test_fanfs_and_its_command_line_do_not_import_torch():
    code = "import sys, fanfs.train, fanfs.cli.main; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_order_sampler_has_a_lazily_staged_mount_fetch_ahead(photo_store, tmp_path, mount, caplog):
    """Issue 30: the training's own order, told by its sampler, is what the node fetches ahead of its loader."""
    from torch.utils.data import DataLoader, DistributedSampler
    index = Store(str(photo_store), check_shards=False).index
    capacity = int(index.blob_stored.sum()) // 2
    with mount(photo_store, "--local-dir", tmp_path / "local", "--stage", "lazy", "--capacity", str(capacity)) as mnt:
        data = photos(mnt)
        sampler = OrderSampler(data, mountpoint=mnt, seed=3)
        loader = DataLoader(data, batch_size=8, sampler=sampler, num_workers=2)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            assert sum(len(labels) for _, labels in loader) == len(data)
        # How far along the order the prefetcher's thread is when the loader ends is the machine's pace (at rest it
        # went through both epochs, skipping what the loader had just read; at load 8-12 it was at 17 of 96, at load 2
        # at 2, its budget held by files of the next epoch, which nobody reads): that it took this order and
        # fetched from it is not.  Waited for (it runs when it gets the CPU), bounded only to fail rather than hang.
        deadline = time.monotonic() + 120
        while not (ahead := mount_stats(mnt)["prefetch"])["files"] and time.monotonic() < deadline:
            time.sleep(0.1)
    assert list(ahead["streams"]) == [sampler.stream]
    assert ahead["streams"][sampler.stream]["files"] == 2 * len(data)  # this epoch and the next
    assert ahead["streams"][sampler.stream]["position"] > 0 and ahead["files"] > 0 and ahead["failed"] == 0
    reference = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=3)
    reference.set_epoch(1)
    assert list(sampler.sampler) == list(reference)  # the indices are the wrapped sampler's
    with mount(photo_store, "--prefetch", "0") as plain:  # a mount that follows no order: training goes on, one warning
        data = photos(plain)
        sampler = OrderSampler(data, mountpoint=plain)
        with caplog.at_level("WARNING", logger="fanfs"):
            assert sorted(sampler) == sorted(sampler) == list(range(len(data)))
        assert sum("did not take the order" in r.message for r in caplog.records) == 1
        assert "budget is 0" in caplog.text and "unknown command" not in caplog.text  # why, in its words
