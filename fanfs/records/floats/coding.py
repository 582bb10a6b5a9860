"""Float values as codes cut into byte planes, and what a view of the first k planes presents.

A chunk of n values becomes n *codes* of P bytes, cut into P byte planes, most significant first:

* **lossless**: the code is the value's IEEE bits (P = the width), so all planes give back the bytes;
* **ELF** (Elves, arXiv 2402.13429), float32 and float64 only: for |w| < 1 the code is the sign and the
  m-bit mantissa q = rint(|w| * 2**m) of 1 + |w| (the exponent of 1 + |w| is constant, so it is not
  stored), left-aligned in P = ceil((m + 1) / 8) bytes; the value presented is sign * q * 2**-m, within
  2**-(m+1) of w.  Values it cannot hold within the bound (|w| near or above 1, NaN, inf, any value
  whose error would exceed the bound) are *exceptions*: kept exactly beside the planes.

At a view of k < P planes the missing bits are filled so that each value lies in the middle of the
interval of values that share its kept bits (for lossless records whose kept bits do not hold the
whole exponent, the middle in value, not in bits), so the error is at most half that interval.  Exact
zeros (a bitmap) stay zero, and exceptions (non-finite values; ELF's outliers) stay exact at every view.
Denormals are ordinary values: the same rule holds for them.

The *side* data of a chunk (exceptions and the zero bitmap) is one small blob, read at every view.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

SIDE = struct.Struct("<II")  # exceptions, bytes of the zero bitmap (0: no exact zero in the chunk); then the
                              # exceptions' positions as gaps (u4), their exact bits, the bitmap


@dataclass(frozen=True)
class Spec:
    """One float dtype: width, exponent and mantissa bits, the unsigned type of its bits."""

    name: str
    width: int
    exp_bits: int
    mant_bits: int

    @property
    def bits(self) -> np.dtype:
        return np.dtype(f"<u{self.width}")

    def to_float64(self, bits: np.ndarray) -> np.ndarray:
        if self.name == "bf16":
            return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
        return bits.view(f"<f{self.width}").astype(np.float64)

    def from_float64(self, values: np.ndarray) -> np.ndarray:
        """Bits of ``values`` rounded to this dtype (to nearest, ties to even)."""
        if self.name == "bf16":
            u = values.astype(np.float32).view(np.uint32).astype(np.uint64)
            return ((u + 0x7FFF + ((u >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)).astype(np.uint16)
        return values.astype(f"<f{self.width}").view(self.bits)


SPECS = {s.name: s for s in (Spec("f16", 2, 5, 10), Spec("bf16", 2, 8, 7), Spec("f32", 4, 8, 23),
                             Spec("f64", 8, 11, 52))}
ELF_DTYPES = ("f32", "f64")


def elf_bits(eps: float | None, spec: Spec) -> int:
    """The fewest mantissa bits m whose rounding error 2**-(m+1) is at most ``eps`` (None: all of them)."""
    if eps is None:
        return spec.mant_bits
    m = 1
    while m < spec.mant_bits and 2.0 ** -(m + 1) > eps:
        m += 1
    return m


@dataclass(frozen=True)
class Coding:
    """How one record's values become codes: lossless (``mbits`` 0) or ELF with ``mbits`` and bound ``eps``."""

    spec: Spec
    mbits: int = 0
    eps: float = 0.0

    @property
    def planes(self) -> int:
        return -(-(self.mbits + 1) // 8) if self.mbits else self.spec.width

    @property
    def code_type(self) -> np.dtype:
        return self.spec.bits if not self.mbits else np.dtype("<u4" if self.planes <= 4 else "<u8")

    # --- pack -------------------------------------------------------------------------------------

    def encode(self, raw: bytes | memoryview) -> tuple[np.ndarray, bytes, bytes]:
        """(codes, side blob, bytes presented at full view) of a chunk of values."""
        spec = self.spec
        bits = np.frombuffer(raw, spec.bits)
        sign_bit = spec.bits.type(1 << (8 * spec.width - 1))
        magnitude = bits & ~sign_bit
        zeros = magnitude == 0
        if not self.mbits:
            exp_mask = spec.bits.type(((1 << spec.exp_bits) - 1) << spec.mant_bits)
            exceptions = np.flatnonzero((bits & exp_mask) == exp_mask)
            return bits, _side(exceptions, bits[exceptions], zeros), bytes(raw)
        m, shift = self.mbits, 8 * self.planes - 1 - self.mbits
        with np.errstate(invalid="ignore", over="ignore"):
            scaled = np.abs(spec.to_float64(bits)) * 2.0 ** m  # exact: a power-of-two scaling
            q = np.rint(scaled)
            inlier = (q < 2.0 ** m) & (np.abs(scaled - q) <= self.eps * 2.0 ** m)  # NaN, inf compare False
        sign = (bits >> spec.bits.type(8 * spec.width - 1)).astype(np.uint64)
        qi = np.where(inlier, q, 0).astype(np.uint64)
        codes = np.where(inlier, (sign << np.uint64(8 * self.planes - 1)) | (qi << np.uint64(shift)), 0)
        exceptions = np.flatnonzero(~inlier)
        shown = self._values(sign, qi)
        shown[exceptions] = bits[exceptions]
        return codes.astype(self.code_type), _side(exceptions, bits[exceptions], zeros), shown.tobytes()

    def planes_of(self, codes: np.ndarray) -> list[bytes]:
        """The byte planes of codes, most significant first."""
        columns = codes.view(np.uint8).reshape(-1, codes.itemsize)
        return [columns[:, self.planes - 1 - j].tobytes() for j in range(self.planes)]

    def interleaved(self, codes: np.ndarray) -> bytes:
        """All planes of each code together (a chunk whose planes compress worse than its codes)."""
        return codes.view(np.uint8).reshape(-1, codes.itemsize)[:, :self.planes].tobytes()

    # --- read -------------------------------------------------------------------------------------

    def codes(self, n: int, planes: list[bytes], interleaved: bytes | None, kept: int) -> np.ndarray:
        """Codes of n values with only their first ``kept`` planes (the rest zero), from planes or interleaved bytes."""
        columns = np.zeros((n, self.code_type.itemsize), np.uint8)
        top = self.planes - 1
        if interleaved is not None:
            lanes = np.frombuffer(interleaved, np.uint8).reshape(n, self.planes)
            columns[:, top - kept + 1:top + 1] = lanes[:, top - kept + 1:]
        else:
            for j in range(kept):
                columns[:, top - j] = np.frombuffer(planes[j], np.uint8)
        return columns.view(self.code_type).reshape(n)

    def present(self, codes: np.ndarray, kept: int, side: bytes) -> bytes:
        """The value bytes presented for codes holding their first ``kept`` planes (``kept == planes``: full)."""
        full = kept >= self.planes
        if full and not self.mbits:
            return codes.tobytes()
        exceptions, exact, zeros = _parse_side(side, self.spec, codes.size)
        if self.mbits:
            out = self._present_elf(codes, kept, zeros)
        else:
            out = self._present_lossless(codes, kept, zeros)
        if exceptions.size:
            out[exceptions] = exact
        return out.tobytes()

    def _values(self, sign: np.ndarray, q: np.ndarray) -> np.ndarray:
        """Bits of sign * q * 2**-m in this dtype (exact: q has at most the dtype's mantissa bits)."""
        spec = self.spec
        real = np.dtype(f"<f{spec.width}")
        magnitude = (q.astype(real) * real.type(2.0 ** -self.mbits)).view(spec.bits)
        return magnitude | (sign.astype(spec.bits) << spec.bits.type(8 * spec.width - 1))

    def _present_elf(self, codes: np.ndarray, kept: int, zeros: np.ndarray | None) -> np.ndarray:
        t = codes.dtype.type
        top = 8 * self.planes - 1
        sign = codes >> t(top)
        q = (codes >> t(top - self.mbits)) & t((1 << self.mbits) - 1)
        if kept < self.planes:
            missing = self.mbits - (8 * kept - 1)  # bits of q not kept (>= 1)
            filled = q | t(1 << (missing - 1))
            q = np.where(zeros, q, filled) if zeros is not None else filled
        return self._values(sign, q)

    def _present_lossless(self, codes: np.ndarray, kept: int, zeros: np.ndarray | None) -> np.ndarray:
        spec = self.spec
        t = spec.bits.type
        missing = 8 * (self.planes - kept)
        if 8 * kept >= 1 + spec.exp_bits:  # the exponent is kept: values are linear in the missing bits
            out = codes | t(1 << (missing - 1))
        else:  # the middle, in value, of [kept bits + 0..0, kept bits + 1..1], the latter capped at the largest finite
            sign_bit = t(1 << (8 * spec.width - 1))
            largest = t((((1 << spec.exp_bits) - 1) << spec.mant_bits) - 1)
            low = codes & ~sign_bit
            high = np.minimum(low | t((1 << missing) - 1), largest)
            middle = spec.from_float64(spec.to_float64(low) / 2 + spec.to_float64(high) / 2)
            out = middle | (codes & sign_bit)
        if zeros is not None:
            out = np.where(zeros, codes, out)
        return out


def _side(exceptions: np.ndarray, exact: np.ndarray, zeros: np.ndarray) -> bytes:
    bitmap = np.packbits(zeros).tobytes() if zeros.any() else b""
    if not exceptions.size and not bitmap:
        return b""
    gaps = np.diff(exceptions, prepend=0).astype("<u4")  # positions as gaps: regular outliers compress well
    return SIDE.pack(exceptions.size, len(bitmap)) + gaps.tobytes() + exact.tobytes() + bitmap


class SideError(ValueError):
    """A chunk's side blob does not fit its chunk (a crafted or mismatched store)."""


def _parse_side(side: bytes, spec: Spec, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(exception positions, their exact bits, zero mask or None) of a chunk of n values."""
    if not side:
        return np.zeros(0, np.int64), np.zeros(0, spec.bits), None
    if len(side) < SIDE.size:
        raise SideError("side blob too short")
    count, bitmap = SIDE.unpack_from(side)
    start = SIDE.size
    if len(side) != start + count * (4 + spec.width) + bitmap or bitmap not in (0, -(-n // 8)) or count > n:
        raise SideError("side blob does not match its chunk")
    positions = np.cumsum(np.frombuffer(side, "<u4", count, start), dtype=np.int64)
    if count and (int(positions[-1]) >= n or (count > 1 and not (np.diff(positions) > 0).all())):
        raise SideError("exceptions out of order or outside their chunk")
    exact = np.frombuffer(side, spec.bits, count, start + 4 * count)
    zeros = None
    if bitmap:
        packed = np.frombuffer(side, np.uint8, bitmap, start + count * (4 + spec.width))
        zeros = np.unpackbits(packed, count=n).view(bool)
    return positions, exact, zeros
