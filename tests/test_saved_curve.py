"""Issue 29: the fidelity curve measured once per store and kept with it (``fanfs fidelity STORE --save``).

Every reader of ``auto:SSIM`` (a mount, ``info``, staging, an fsspec reader) then looks it up and measures
nothing, even on a node that has never seen the store; a saved curve that is not this index's, corrupt or
crafted is refused with one line; the store with it is still a store (``pack --force``, ``verify``,
staging); without one, the first measurement says what it does and how to avoid it.
"""

from __future__ import annotations

import json
import os
import shutil

import fsspec
import pytest
import xxhash
from fanfs_command import fanfs
from photo_samples import make_photo_set

import fanfs.fsspec as _protocol  # noqa: F401  (registers the protocol; "as": the name fanfs is the command)
from fanfs.tune import fidelity
from fanfs.errors import StoreError
from fanfs.store import Store
from fanfs.tune.curve import saved_curve

CURVE = "fidelity.json"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A store of real photos with resolution tiers and its curve saved; and a copy of that curve file."""
    base = tmp_path_factory.mktemp("saved")
    make_photo_set(base / "src" / "photos", 12)
    store = base / "store"
    fanfs("pack", base / "src", store, "--scales", "2", "--quiet")
    done = fanfs("fidelity", store, "--sample", "12", "--timed", "2", "--save")
    assert f"saved: {store / CURVE}" in done.stdout
    shutil.copy(store / CURVE, base / "curve.json")
    return store, base / "curve.json"


@pytest.fixture
def fresh_node(tmp_path):
    """The environment of a node that has never seen the store: an empty runtime directory."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    return {**os.environ, "FANFS_RUNTIME_DIR": str(runtime)}, runtime


def _measured_here(runtime) -> list[str]:
    return [name for name in os.listdir(runtime) if name.startswith("fidelity-")]


def test_a_fresh_node_reads_the_saved_curve_and_measures_nothing(saved, fresh_node, mount, monkeypatch):
    store, _ = saved
    env, runtime = fresh_node
    curve = json.loads((store / CURVE).read_text())["content"]
    k = next(k for k, s in zip(curve["ks"], curve["ssim"]) if s >= 0.95)
    done = fanfs("info", store, "--fidelity", "auto:0.95", env=env)
    assert f"auto:0.95 -> {k} " in done.stderr and "saved with the store" in done.stderr
    assert "measuring" not in done.stderr and not _measured_here(runtime)
    with mount(store, "--fidelity", "auto:0.95") as mnt:  # a real mount resolves it the same way
        assert json.loads(fanfs("stats", mnt, "--json").stdout)["fidelity"] in (k, str(k))
    # in-process (fsspec, a job's rank 0): a measurement would fail here, so none happens
    monkeypatch.setenv("FANFS_RUNTIME_DIR", str(runtime))
    monkeypatch.setattr(fidelity, "analyse", lambda *a, **kw: pytest.fail("measured although a curve is saved"))
    fs = fsspec.filesystem("fanfs", store=str(store), fidelity="auto:0.95", skip_instance_cache=True)
    assert fs.presentation["fidelity"] == k
    assert not _measured_here(runtime)


def test_without_a_saved_curve_the_measurement_says_what_it_does(saved, fresh_node, tmp_path):
    store, _ = saved
    env, runtime = fresh_node
    bare = tmp_path / "bare"
    shutil.copytree(store, bare)
    (bare / CURVE).unlink()
    first = fanfs("info", bare, "--fidelity", "auto:0.95", env=env)
    assert "measuring the fidelity curve" in first.stderr and f"fanfs fidelity {bare} --save" in first.stderr
    assert "measured on this node" in first.stderr and _measured_here(runtime)
    again = fanfs("info", bare, "--fidelity", "auto:0.95", env=env)  # cached on this node: no measurement
    assert "measuring" not in again.stderr


def _seal(body: dict) -> dict:
    text = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return {**body, "checksum": f"{xxhash.xxh3_64_intdigest(text):016x}"}


def _crafted(original: dict, how: str) -> bytes | None:
    """A curve file crafted ``how``; None: made on disk by the test itself."""
    body = {key: value for key, value in original.items() if key != "checksum"}
    content = body["content"]
    if how == "other store":
        return json.dumps(_seal({**body, "store_id": "0" * 32})).encode()
    if how == "other index":
        return json.dumps(_seal({**body, "index_checksum": "0123456789abcdef"})).encode()
    if how == "edited":  # a value changed, the checksum left as it was
        return json.dumps({**original, "content": {**content, "ssim": [1.0] * len(content["ssim"])}}).encode()
    if how == "garbage":
        return os.urandom(4096)
    if how == "huge":
        return b" " * (2 << 20) + json.dumps(original).encode()
    if how == "newer format":
        return json.dumps(_seal({**body, "format": 2})).encode()
    sealed = {"impossible SSIM": {**content, "ssim": [5.0] * len(content["ssim"])},
              "NaN": {**content, "ssim": [float("nan")] * len(content["ssim"])},
              "wrong Ks": {**content, "ks": [3, 1]},
              "no tiers": {**content, "tiers": []},
              "booleans": {**content, "images": True},
              "extra key": {**content, "exec": "rm -rf /"},
              "nested deep": {**content, "skipped": {"x": [[[[1]]]]}}}
    if how in sealed:
        text = json.dumps({**body, "content": sealed[how]}).encode() if how == "NaN" else None
        return text or json.dumps(_seal({**body, "content": sealed[how]})).encode()
    return None


CRAFTED = ["other store", "other index", "edited", "garbage", "huge", "newer format", "impossible SSIM", "NaN",
           "wrong Ks", "no tiers", "booleans", "extra key", "nested deep", "symlink", "fifo", "directory"]


ONE_LINE = {"other index", "garbage", "symlink", "impossible SSIM"}
"""Cases also run through the command line (a few processes each); every case is checked in-process."""


@pytest.mark.parametrize("how", CRAFTED)
def test_a_crafted_saved_curve_is_refused_with_one_line(saved, tmp_path, how):
    store, good = saved
    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    path = copy / CURVE
    path.unlink()
    data = _crafted(json.loads(good.read_text()), how)
    if data is not None:
        path.write_bytes(data)
    elif how == "symlink":
        path.symlink_to(good)  # the very file that was saved, but through a link someone planted
    elif how == "fifo":
        os.mkfifo(path)  # an open that followed it would block forever
    else:
        path.mkdir()
    with pytest.raises(StoreError) as refused:
        saved_curve(Store(str(copy), check_shards=False))
    message = str(refused.value)
    assert len(message.splitlines()) == 1 and message.startswith(f"{path}: ") and "fanfs fidelity STORE --save" in message
    if how not in ONE_LINE:
        return
    done = fanfs("info", copy, "--fidelity", "auto:0.95", check=False, timeout=60)
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [f"fanfs: error: {message}"], (how, done.stderr)
    assert "fidelity   the saved curve is refused: " in fanfs("info", copy).stdout  # info still says the rest
    if how != "impossible SSIM":  # what the container checks, verify checks too
        checked = fanfs("verify", copy, "--quiet", check=False, timeout=60)
        assert checked.returncode == 1 and str(path) in checked.stderr, how


def test_a_store_with_a_saved_curve_is_still_a_store(saved, tmp_path):
    """verify passes and says so, staging ignores it, and pack --force replaces such a store (its curve with it)."""
    store, _ = saved
    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    assert f"{CURVE}: a measurement saved with this index, intact" in fanfs("verify", copy, "--quiet").stdout
    assert "fidelity   curve saved with the store (12 sampled images; auto:0.95 -> " in fanfs("info", copy).stdout
    staged = fanfs("stage", copy, tmp_path / "local", "--fidelity", "auto:0.95", "--quiet")
    assert "fanfs: error" not in staged.stderr and (tmp_path / "local").is_dir()
    (copy / f"{CURVE}.tmp-999999").write_bytes(b'{"format": 1, "sto')  # what a save killed midway leaves
    fanfs("pack", store.parent / "src", copy, "--force", "--quiet")  # refused before: "not a fanfs store"
    assert not (copy / CURVE).exists() and not (copy / f"{CURVE}.tmp-999999").exists()  # a new store: the old index's curve went with it
    assert saved_curve(Store(str(copy), check_shards=False)) is None
