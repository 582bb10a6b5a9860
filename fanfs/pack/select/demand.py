"""What training demands of a codec: the read rate, the threads, sync or async decoding, and capacity."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...codecs import rate_kept_up, required_decode
from ...errors import UsageError
from ...util import units


class SelectError(UsageError):
    """Bad arguments or an unreadable source (one-line reason)."""


@dataclass
class Demand:
    mode: str = "async"
    rate: float | None = None  # demanded bytes/s (--rate)
    samples_per_sec: float | None = None
    threads: int = 2
    overhead: float = 0.05
    headroom: float = 0.20
    capacity: int | None = None  # bytes per node
    nodes: int = 1
    replicas: int = 1

    def __post_init__(self) -> None:
        if self.mode not in ("sync", "async"):
            raise SelectError(f"mode must be sync or async, not {self.mode!r}")
        if self.rate is not None and self.samples_per_sec is not None:
            raise SelectError("give --rate or --samples-per-sec, not both")
        for name in ("rate", "samples_per_sec"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise SelectError(f"{name.replace('_', '-')} must be positive")
        if self.threads < 1:
            raise SelectError("--threads must be at least 1")
        if not 0 < self.overhead:
            raise SelectError("--overhead must be more than 0% (sync reads then allow no decoding at all)")
        if self.headroom < 0:
            raise SelectError("--headroom cannot be negative")
        if self.capacity is not None:
            if self.capacity <= 0 or self.nodes < 1 or self.replicas < 1:
                raise SelectError("--capacity, --nodes and --replicas must be positive")
            if self.replicas > self.nodes:
                raise SelectError(f"{self.replicas} replicas need at least {self.replicas} nodes, not {self.nodes}")

    def byte_rate(self, mean_file_size: float) -> float | None:
        """R: demanded raw bytes per second."""
        if self.rate is not None:
            return float(self.rate)
        if self.samples_per_sec is not None:
            return self.samples_per_sec * mean_file_size
        return None

    def required_decode(self, rate: float | None, threads: int | None = None) -> float:
        """Per-thread decode speed (bytes/s) a codec needs at byte rate ``rate``; 0 without a rate."""
        return required_decode(rate, threads or self.threads, self.mode, self.overhead, self.headroom)

    def rate_for(self, decode: float, threads: int | None = None) -> float:
        """The highest byte rate a per-thread decode speed ``decode`` keeps up with (inverse of the above)."""
        return rate_kept_up(decode, threads or self.threads, self.mode, self.overhead, self.headroom)

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "rate_Bps": self.rate, "samples_per_sec": self.samples_per_sec,
                "threads": self.threads, "overhead": self.overhead, "headroom": self.headroom,
                "capacity": self.capacity, "nodes": self.nodes, "replicas": self.replicas}


def parse_rate(text: str) -> float:
    """``800MB/s`` -> 8e8 bytes/s (:func:`fanfs.util.units.parse_rate`), one line if it is not a rate."""
    try:
        return units.parse_rate(text)
    except ValueError as err:
        raise SelectError(str(err)) from None


def parse_fraction(text: str) -> float:
    """``5%`` or ``0.05`` -> 0.05."""
    s = str(text).strip()
    try:
        value = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    except ValueError:
        raise SelectError(f"not a fraction: {text!r} (use e.g. 5% or 0.05)") from None
    if value < 0:
        raise SelectError(f"not a fraction: {text!r}")
    return value
