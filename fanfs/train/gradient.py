"""PCR's task-aware choice of fidelity: the lowest K whose gradient points where full fidelity's does.

Kuchnik et al. (PCR, VLDB 2021; ``calculate_scan_gradient_similarity`` in their released code) pick the
scan group per task: on a few fixed batches, the model's gradient (summed over the batches, every
parameter flattened into one vector) at full fidelity and at each candidate K; the smallest K whose
cosine similarity to the full one exceeds a threshold (0.8) is used until the next check.

Here the mount does the switching: the same samples (a fixed :class:`torch.utils.data.Subset` of the
training's own dataset, read in order) are re-read through a fresh ``DataLoader`` after each switch of
the mount's fidelity, so files are opened after the switch and get the new K, in workers too.
Candidates are tried from the lowest up and the first that passes wins (what PCR computes, without
measuring the Ks above it); the mount is left at the winner (or full when none passes).  From a store
packed with ``--scales`` the resolution tiers are candidates too, below every K (``candidates=["1/4", "1/2",
2, 4]``; by default every tier and K the store offers), for a model whose transform resizes its input.

Mode: training mode, as PCR, because the gradient that matters is the one the next steps follow (batch
norm then uses each batch's own statistics, which the fidelity changes too).  What training mode would
randomise is pinned: every pass runs from the same seeds (torch, numpy and ``random``, in the
DataLoader's workers too), so dropout masks and the dataset's random crops are the same at every K.
An untrained model is no judge: its gradient at one scan points much where full fidelity's does (a fresh CNN picked
K=1, SSIM 0.83), so the choice warns when, on the same samples at full fidelity, the model's loss on their own
targets is not clearly below its loss on the targets shifted by one sample (it has learned nothing of them yet):
call it after some epochs at full fidelity, as PCR does.  Nothing is left behind: gradients come from
``torch.autograd.grad`` (no ``.grad`` is touched), no
optimiser step is taken, the running statistics training mode updates and every module's mode are put
back, and so is the caller's random state::

    from fanfs.train import choose_fidelity
    choice = choose_fidelity(model, torch.nn.functional.cross_entropy, dataset, "/tmp/imagenet",
                             batches=4, batch_size=64, num_workers=4)
    print(choice)       # fidelity 2: gradient cosine similarity to full fidelity K=1 0.741, K=2 0.913 ...
"""

from __future__ import annotations

import contextlib
import logging
import numbers
import os
import random
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from ..records import FULL, parse_level, setting
from ..serve.control import presenter
from .mount import fidelity_ks, fidelity_offered, mount_status

log = logging.getLogger("fanfs")

UNTRAINED = 0.9
"""The model looks untrained when its loss on the samples' own targets is above this fraction of its loss on
targets shifted by one sample (an untrained model's two losses are about equal)."""

THRESHOLD = 0.8
"""PCR's: a K passes when the cosine similarity of its gradient to full fidelity's reaches it (PCR: exceeds;
the same for any measured value, and a threshold of 1 then means a gradient equal to full's)."""


@dataclass(frozen=True)
class FidelityChoice:
    """The fidelity chosen (FULL when no candidate passed) and the similarity measured per K, lowest K first."""

    fidelity: int
    threshold: float
    similarity: dict[int, float]
    images: int
    learned: float | None = None
    """The model's loss on the samples' own targets over its loss on shifted ones, at full fidelity (None: the
    targets are not tensors of one per sample); above :data:`UNTRAINED`, the choice warned: an untrained model."""

    def __str__(self) -> str:
        name_of = setting("fidelity").format
        measured = ", ".join(f"{'K=' * name_of(k).isdigit()}{name_of(k)} {s:.3f}" for k, s in self.similarity.items())
        name = name_of(self.fidelity)
        verdict = "" if self.fidelity != FULL else f", none reaches {self.threshold}"
        return (f"fidelity {name}: gradient cosine similarity to full fidelity {measured}{verdict} "
                f"(threshold {self.threshold}, {self.images} images)")


def choose_fidelity(model: Any, loss_fn: Callable[[Any, Any], Any], dataset: Any, mountpoint: str | os.PathLike, *,
                    candidates: Sequence[int | str] | None = None, threshold: float = THRESHOLD, batches: int = 4,
                    batch_size: int = 32, num_workers: int = 0, collate_fn: Callable | None = None, seed: int = 0,
                    switch: bool = True) -> FidelityChoice:
    """Measure the candidates' gradient similarity on ``batches`` fixed batches and switch the mount to the winner.

    ``dataset`` yields ``(input, target)`` pairs read from files under ``mountpoint`` (the training's own,
    unmodified); ``loss_fn(model(inputs), targets)`` is a scalar.  ``candidates`` default to every K the
    store offers below full.  With ``switch=False`` the mount goes back to the fidelity it had.  Call it
    between epochs: while it measures, every reader of the mount sees the candidate Ks.
    """
    import torch

    threshold, ks = _checked(candidates, threshold, batches, batch_size)
    mnt = os.fspath(mountpoint)
    before = int(mount_status(mnt)["fidelity"])
    layers, offered = len(fidelity_ks(mnt)) + 1, fidelity_offered(mnt)
    if ks is None:
        ks = offered
    elif set(ks) - set(offered) - set(range(1, layers + 1)):
        name_of = setting("fidelity").format
        tiers = [name_of(k) for k in offered if not name_of(k).isdigit()]
        raise UsageError(f"candidate fidelity {name_of(max(set(ks) - set(offered) - set(range(1, layers + 1))))} is out of range: this store's "
                         f"records have at most {layers} layers ({'tiers ' + ', '.join(tiers) if tiers else 'no resolution tiers'})")
    if not ks:
        raise UsageError("this store's JPEG records have a single layer each: there is no fidelity below full")
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise UsageError("the model has no parameter that requires a gradient: nothing to compare")
    if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__len__"):
        raise UsageError("choose_fidelity needs a map-style dataset (indexable, with a length) to re-read the same samples")
    if len(dataset) == 0:
        raise UsageError("the dataset is empty: choose_fidelity needs samples to read")
    indices = sorted(random.Random(seed).sample(range(len(dataset)), min(len(dataset), batches * batch_size)))
    samples = torch.utils.data.Subset(dataset, indices)

    def gradient() -> Any:
        loader = torch.utils.data.DataLoader(samples, batch_size=batch_size, shuffle=False, num_workers=num_workers,
                                             collate_fn=collate_fn)
        with _pinned_randomness(seed):
            return _summed_gradient(model, loss_fn, loader, params)

    apply = presenter(mnt, "fidelity")
    shown: int | None = before  # what the mount presents (None: unknown after a failed switch)

    def present(k: int) -> None:
        nonlocal shown
        if k != shown:
            shown = None
            apply(k)
            shown = k

    chosen, after = FULL, before
    similarity: dict[int, float] = {}
    with _model_kept(model), torch.enable_grad():
        model.train()
        try:
            present(FULL)
            reference = gradient()
            if not bool(torch.isfinite(reference).all()) or not bool(reference.any()):
                raise UsageError("the gradient at full fidelity is zero or not finite on these samples: no fidelity "
                                 "can be compared with it (check the loss and the model)")
            learned = _learned(model, loss_fn, torch.utils.data.DataLoader(
                samples, batch_size=batch_size, shuffle=False, num_workers=num_workers, collate_fn=collate_fn), seed)
            for k in ks:
                present(k)
                similarity[k] = _cosine(reference, gradient())
                if similarity[k] >= threshold:
                    chosen = k
                    break
            if switch:
                after = chosen
        finally:
            present(after)
    choice = FidelityChoice(chosen, threshold, similarity, len(indices), learned)
    log.info("%s", choice)
    if learned is not None and learned > UNTRAINED:
        message = (f"choose_fidelity: the model looks untrained (its loss on these samples' targets is {learned:.0%} of "
                   f"its loss on shuffled ones): an untrained model's gradient agrees with full fidelity's at low K, "
                   f"so fidelity {setting('fidelity').format(chosen)} may starve the training of detail; choose after "
                   "some epochs at full fidelity (PCR re-checks every few epochs)")
        log.warning("%s", message)
        warnings.warn(message, UserWarning, stacklevel=2)
    return choice


def _checked(candidates: Sequence[int] | None, threshold: float, batches: int,
             batch_size: int) -> tuple[float, list[int] | None]:
    """Validated arguments: the threshold, and the candidates sorted without FULL (the reference and fallback)."""
    if not _is(threshold, numbers.Real) or not 0 < threshold <= 1:
        raise UsageError(f"threshold must be a number in (0, 1] (PCR uses 0.8), not {threshold!r}")
    for name, value in (("batches", batches), ("batch_size", batch_size)):
        if not _is(value, numbers.Integral) or value < 1:
            raise UsageError(f"{name} must be a whole number >= 1, not {value!r}")
    if candidates is None:
        return float(threshold), None
    listed = list(candidates)
    if any(not isinstance(k, str) and (not _is(k, numbers.Integral) or not 0 < k <= FULL) for k in listed):
        raise UsageError(f"candidate fidelities are layer counts >= 1 or resolution tiers ('1/2'), not {listed!r}")
    ks = sorted({parse_level("fidelity", k if isinstance(k, str) else int(k)) for k in listed} - {FULL},
                key=setting("fidelity").rank)
    if not ks:
        raise UsageError("no candidate fidelity below full: give at least one K, e.g. candidates=[1, 2, 5]")
    return float(threshold), ks


def _is(value: Any, kind: type) -> bool:
    """A number of that kind, and not a bool (True is no threshold nor batch count)."""
    return isinstance(value, kind) and not isinstance(value, bool)


def _summed_gradient(model: Any, loss_fn: Callable, loader: Any, params: list) -> Any:
    """The gradient of the loss summed over the loader's batches, all parameters in one flat float64 vector."""
    import torch
    device = params[0].device
    total = None
    for batch in loader:
        if not isinstance(batch, (tuple, list)) or len(batch) != 2:
            raise UsageError("choose_fidelity needs a dataset of (input, target) pairs")
        inputs, targets = (t.to(device) if isinstance(t, torch.Tensor) else t for t in batch)
        grads = torch.autograd.grad(loss_fn(model(inputs), targets), params, allow_unused=True)
        flat = torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1) for g, p in zip(grads, params)])
        total = flat.double() if total is None else total.add_(flat)
    return total


def _learned(model: Any, loss_fn: Callable, loader: Any, seed: int) -> float | None:
    """The loss on the samples' own targets over the loss on the same targets shuffled among the samples (all
    batches at once, no gradient, from the same seeds); None where outputs or targets are not a tensor row per
    sample."""
    import torch
    outputs, targets = [], []
    device = next(iter(model.parameters())).device
    with torch.no_grad(), _pinned_randomness(seed):
        for inputs, target in loader:
            output = model(inputs.to(device) if isinstance(inputs, torch.Tensor) else inputs)
            if not isinstance(target, torch.Tensor) or not isinstance(output, torch.Tensor) or target.dim() == 0 \
                    or len(target) != len(output):
                return None
            outputs.append(output)
            targets.append(target.to(device))
        output, target = torch.cat(outputs), torch.cat(targets)
        if len(target) < 2:
            return None
        shuffled = target[torch.randperm(len(target), generator=torch.Generator().manual_seed(seed)).to(device)]
        own, other = float(loss_fn(output, target)), float(loss_fn(output, shuffled))
    return own / other if other > 0 else None


def _cosine(a: Any, b: Any) -> float:
    norms = float(a.norm()) * float(b.norm())
    return float(a @ b) / norms if norms else 0.0


@contextlib.contextmanager
def _pinned_randomness(seed: int) -> Iterator[None]:
    """Run the block from ``seed`` (torch's CPU and CUDA generators, numpy's and ``random``'s); restore them after.

    The DataLoader draws its workers' seeds from torch's generator, so their random transforms repeat too.
    """
    import numpy as np
    import torch
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    python, legacy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=cuda):
        torch.default_generator.manual_seed(seed)
        if cuda:
            torch.cuda.manual_seed_all(seed)
        random.seed(seed)
        np.random.seed(seed)
        try:
            yield
        finally:
            random.setstate(python)
            np.random.set_state(legacy)


@contextlib.contextmanager
def _model_kept(model: Any) -> Iterator[None]:
    """Put every module's mode and every buffer (batch norm's running statistics) back as they were."""
    import torch
    modes = [(module, module.training) for module in model.modules()]
    buffers = [(buffer, buffer.detach().clone()) for buffer in model.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)
        for module, training in modes:
            module.training = training
