#!/usr/bin/env python3
"""How to encode resolution tiers: bytes against SSIM and decode time for ways of quantizing them.

The tiers that ``pack --scales 2,4`` stores cost 43-45% of the store with the source's own quantization
(the issue's budget: 35%).  Per image of a set (docs/fidelity.rst's: ``--size-kb 110`` colour photos, or the
mixed ``make_photo_set``), each tier (Pillow's ``reduce``, as pack makes it) is encoded every way below,
and per way this reports the tiers' bytes as a fraction of the full progressive record (``compact``
scans; their sum is the store's growth), mean and lowest luma SSIM against the reduced image (what
``fanfs fidelity`` reports), mean chroma PSNR (SSIM is luma only: it cannot see chroma) and the median
decode time relative to the source-table tier (interleaved rounds, ``fanfs.tune.decode_speed``):

- ``source``: the source's tables (``--tier-quality 100``); ``source xF``: every step times F;
- ``quality Q``: each step the coarser of the source's and libjpeg's at Q (``--tier-quality Q``);
- ``... progressive``: the same, progressive (smaller in principle; tiers are there to decode fast);
- ``quality Q 4:2:0``: 4:4:4 sources' tiers subsampled (the others unchanged).
"""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import common_args, load_average, make_jpegs, table, temp_dir, write_json  # noqa: E402

from photo_samples import make_photo_set  # noqa: E402

from fanfs.records.jpeg.scans import scan_script  # noqa: E402
from fanfs.records.jpeg.tiers import tier_tables  # noqa: E402
from fanfs.records.jpeg.transcode import to_progressive  # noqa: E402
from fanfs.tune.decode_speed import decode_times  # noqa: E402
from fanfs.tune.quality import similarity  # noqa: E402

Way = Callable[[dict, int], dict]
"""(source tables, source subsampling) -> Pillow save options."""


def scaled(factor: float) -> Way:
    return lambda tables, _: {"qtables": [[min(255, max(1, round(q * factor))) for q in t] for t in tables.values()]}


def capped(quality: int, progressive: bool = False, subsample: bool = False) -> Way:
    def options(tables: dict, sampling: int) -> dict:
        out = {"qtables": tier_tables(tables, quality), "progressive": progressive}
        return {**out, "subsampling": 2} if subsample and sampling == 0 else out
    return options


WAYS: dict[str, Way] = {
    "source": capped(100), "source x1.25": scaled(1.25), "source x1.5": scaled(1.5), "source x1.75": scaled(1.75),
    "source x2": scaled(2.0), "quality 75": capped(75), "quality 78": capped(78), "quality 80": capped(80),
    "quality 82": capped(82), "quality 85": capped(85), "quality 88": capped(88),
    "source progressive": capped(100, progressive=True), "quality 80 progressive": capped(80, progressive=True),
    "quality 80 4:2:0": capped(80, subsample=True),
}


def chroma_psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR of the Cb and Cr planes (NaN for grayscale)."""
    from PIL import Image
    if a.ndim == 2:
        return float("nan")
    ca, cb = (np.asarray(Image.fromarray(x).convert("YCbCr"), dtype=np.float64)[:, :, 1:] for x in (a, b))
    return float(10 * np.log10(255 ** 2 / max(((ca - cb) ** 2).mean(), 1e-9)))


def measure(images: list[bytes], scales: tuple[int, ...], rounds: int) -> tuple[dict, int]:
    """Per (way, scale): total tier bytes and per-image SSIM, chroma PSNR and decode time x the source's; and the
    full records' total bytes."""
    from PIL import Image, JpegImagePlugin
    compact = scan_script("compact")
    rng = np.random.default_rng(0)
    acc: dict = {(way, s): {"bytes": 0, "ssim": [], "chroma_psnr": [], "decode": []} for way in WAYS for s in scales}
    full = 0
    for data in images:
        full += len(to_progressive(data, compact))
        with Image.open(io.BytesIO(data)) as im:
            tables, sampling = im.quantization, JpegImagePlugin.get_sampling(im)
            im.load()
            for s in scales:
                reduced = im.reduce(s)
                blobs = []
                for way in WAYS.values():
                    out = io.BytesIO()
                    reduced.save(out, "JPEG", optimize=True, **{"subsampling": sampling, **way(tables, sampling)})
                    blobs.append(out.getvalue())
                times = decode_times(blobs, rng, rounds)
                for way, blob, seconds in zip(WAYS, blobs, times):
                    decoded = np.asarray(Image.open(io.BytesIO(blob)))
                    row = acc[way, s]
                    row["bytes"] += len(blob)
                    row["ssim"].append(similarity(np.asarray(reduced), decoded)[0])
                    row["chroma_psnr"].append(chroma_psnr(np.asarray(reduced), decoded))
                    row["decode"].append(seconds / times[0])
    return acc, full


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_args(parser)
    parser.add_argument("--images", type=int, default=300, help="images in the set (default 300)")
    parser.add_argument("--size-kb", type=int, help="colour 4:2:0 images of about this size instead of the mixed photo set")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved decode rounds per image (default 5)")
    args = parser.parse_args()
    scales = (2, 4)
    if args.size_kb:
        images = make_jpegs(args.images, args.size_kb * 1024)
    else:
        with temp_dir(args.workdir, "bench-tier-quality-") as work:
            images = [p.read_bytes() for p in make_photo_set(work, args.images)]
    acc, full = measure(images, scales, args.rounds)
    rows, report = [], {}
    for way in WAYS:
        cells: list = [way]
        report[way] = {}
        for s in scales:
            r = acc[way, s]
            chroma = [v for v in r["chroma_psnr"] if not np.isnan(v)]
            report[way][f"1/{s}"] = {"bytes_fraction": r["bytes"] / full, "ssim": float(np.mean(r["ssim"])),
                                     "ssim_min": float(np.min(r["ssim"])),
                                     "chroma_psnr": float(np.mean(chroma)) if chroma else None,
                                     "decode_vs_source": float(np.median(r["decode"]))}
            m = report[way][f"1/{s}"]
            cells += [f"{m['bytes_fraction']:.3f}", f"{m['ssim']:.3f}", f"{m['ssim_min']:.3f}",
                      f"{m['chroma_psnr']:.1f}" if m["chroma_psnr"] else "-", f"{m['decode_vs_source']:.2f}x"]
        cells.append(f"+{sum(acc[way, s]['bytes'] for s in scales) / full:.1%}")
        rows.append(cells)
    print(f"{args.images} {'colour ~%d KB' % args.size_kb if args.size_kb else 'mixed'} photos, full records "
          f"{full / len(images) / 1024:.1f} KB on average (load {load_average()})")
    heads = [f"{h} 1/{s}" for s in scales for h in ("bytes", "SSIM", "min", "CbCr dB", "decode")]
    print(table(["tier encoding", *heads, "growth"], rows))
    print("bytes: x the full record; SSIM (mean, min): luma, against the reduced image; CbCr dB: chroma PSNR; "
          "decode: median time x the source-table tier's")
    write_json(args.json, {"images": args.images, "size_kb": args.size_kb, "ways": report})
    return 0


if __name__ == "__main__":
    sys.exit(main())
