"""Issue 12.5: adaptive precision during training (Zhuang, Malossi, Casas 2020) with a PlateauSchedule.

Unit tests of the schedule, then real torch (2.13.0, CPU): a tiny model reads its inputs through a
mount with an unmodified Dataset and DataLoader (persistent worker processes), starting at precision 8;
the schedule raises the precision through the control socket whenever the training loss stops improving.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from fanfs_command import fanfs, mount_stats

from fanfs.errors import UsageError
from fanfs.records import FULL
from fanfs.serve.control import presenter
from fanfs.tune.plateau import PlateauSchedule


def test_schedule_raises_after_patience_without_improvement():
    applied: list[int] = []
    schedule = PlateauSchedule([8, 16, 24, FULL], patience=2, min_delta=0.01, apply=applied.append)
    assert schedule.start() == 8 and applied == [8]
    changes = [schedule.step(loss) for loss in (1.0, 0.5, 0.495, 0.499, 0.3, 0.3, 0.3, 0.2, 0.2, 0.2, 0.2, 0.2)]
    # 0.495 and 0.499 do not beat 0.5 by 0.01: raise to 16; 16 is judged afresh from 0.3 ...
    assert changes == [None, None, None, 16, None, None, 24, None, None, FULL, None, None]
    assert applied == [8, 16, 24, FULL] and schedule.done and schedule.level == FULL
    assert schedule.history == [(0, 8), (4, 16), (7, 24), (10, FULL)]


def test_schedule_relative_delta_and_resume():
    schedule = PlateauSchedule([1, 3, FULL], patience=1, min_delta=0.1, relative=True)
    schedule.start()
    assert schedule.step(100.0) is None and schedule.step(95.0) == 3  # 5% is no 10% improvement
    applied: list[int] = []
    resumed = PlateauSchedule([1, 3, FULL], patience=1, min_delta=0.1, relative=True, apply=applied.append)
    resumed.load_state_dict(json.loads(json.dumps(schedule.state_dict())))
    assert resumed.level == 3 and applied == [3] and resumed.step(10.0) is None and resumed.step(10.0) == FULL


@pytest.mark.parametrize("kwargs", [{"levels": []}, {"levels": [16, 8]}, {"levels": [8, 8]},
                                    {"levels": [8], "patience": 0}, {"levels": [8], "min_delta": -1}])
def test_schedule_refuses_nonsense(kwargs):
    with pytest.raises(UsageError):
        PlateauSchedule(**kwargs)
    with pytest.raises(ValueError):
        PlateauSchedule([8, FULL]).step(math.nan)


def test_presenter_refuses_unknown_settings_and_values():
    with pytest.raises(UsageError):
        presenter("/nonexistent", "colour")
    with pytest.raises(UsageError):
        presenter("/nonexistent", "precision")(0)


FEATURES, SAMPLES = 32, 384


class MountedFeatures:
    """An ordinary map-style dataset of one .npy feature vector per sample (nothing fanfs-specific)."""

    def __init__(self, root: Path, targets: np.ndarray) -> None:
        self.root, self.targets = root, targets

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int):
        import torch
        x = np.load(self.root / "x" / f"{i:04d}.npy")
        return torch.from_numpy(x), torch.tensor([self.targets[i]], dtype=torch.float32)


@pytest.mark.slow
def test_training_raises_precision_when_the_loss_plateaus(tmp_path, mount):
    import torch
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    src = tmp_path / "src"
    (src / "x").mkdir(parents=True)
    w = rng.standard_normal(FEATURES)
    xs = rng.standard_normal((SAMPLES, FEATURES)).astype(np.float32)
    for i, x in enumerate(xs):
        np.save(src / "x" / f"{i:04d}.npy", x)
    targets = (xs.astype(np.float64) @ w).astype(np.float32)
    store = tmp_path / "store"
    fanfs("pack", src, store, "--float-records", "--quiet")
    with mount(store) as mnt:
        schedule = PlateauSchedule([8, 16, FULL], patience=2, min_delta=1e-3, relative=True,
                                   apply=presenter(str(mnt), "precision"))
        schedule.start()
        loader = torch.utils.data.DataLoader(MountedFeatures(mnt, targets), batch_size=32, shuffle=True,
                                             num_workers=2, persistent_workers=True)
        model = torch.nn.Linear(FEATURES, 1)
        optimiser = torch.optim.SGD(model.parameters(), lr=0.05)
        losses, levels, layers = [], [], []
        for epoch in range(40):
            total = 0.0
            for x, y in loader:
                optimiser.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                optimiser.step()
                total += loss.item() * len(x)
            losses.append(total / SAMPLES)
            levels.append(schedule.level)
            layers.append(len(mount_stats(mnt)["stored_by_layer"]))
            schedule.step(losses[-1])
            if schedule.done and levels[-1] == FULL and len(levels) - levels.index(FULL) >= 3:
                break
        first_full = levels.index(FULL)
    print("loss by epoch", [round(v, 4) for v in losses], "levels", levels, "history", schedule.history)
    assert levels[0] == 8 and 16 in levels and levels[-1] == FULL  # raised twice, through the control socket
    assert layers[levels.index(16) - 1] == 2  # while at precision 8 only layer 0 and plane 1 were read
    coarse = min(losses[:levels.index(16)])
    assert coarse > 10 * losses[-1]  # precision 8 alone could not fit the data
    assert losses[-1] < 1e-3 * np.mean(targets ** 2)  # at full precision it does (exact inputs)
    assert first_full < 39
