"""Progressive JPEG records: lossless transcoding, layer splitting, presentation at fidelity k."""

from __future__ import annotations

import io
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from PIL import Image, ImageFile

from fanfs.records.jpeg.markers import EOI, JpegError, end_of_image, looks_like_jpeg, present, presented_size, split_layers
from fanfs.records.jpeg.scans import ScanScript
from fanfs.records.jpeg.transcode import to_progressive

from support.jpeg_samples import ALL_NAMES, BROKEN, ORIENTATION, build_samples

assert not ImageFile.LOAD_TRUNCATED_IMAGES
needs_jpegtran = pytest.mark.skipif(shutil.which("jpegtran") is None, reason="jpegtran not installed")

# libjpeg's default progression (jpeg_simple_progression): 10 scans for YCbCr, 2 + 4 per
# component otherwise (6 for grayscale, 18 for CMYK).
DEFAULT_LAYERS = {"RGB": 10, "L": 6, "CMYK": 18}

# The default colour script with the first luma AC scan split in two and the chroma DC refined
# separately: 12 scans, lossless.
CUSTOM_SCRIPT = """\
# finer first steps
0,1,2: 0-0, 0, 1;
0:     1-5, 0, 2;
0:     6-63, 0, 2;
2:     1-63, 0, 1;
1:     1-63, 0, 1;
0:     1-63, 2, 1;
0:     0-0, 1, 0;
1,2:   0-0, 1, 0;
2:     1-63, 1, 0;
1:     1-63, 1, 0;
0:     1-5, 1, 0;
0:     6-63, 1, 0;
"""


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    s = build_samples(tmp_path_factory.mktemp("jpeg_samples"))
    if not s:
        pytest.skip("no sample photos installed (sklearn, skimage, matplotlib)")
    return {name: path.read_bytes() for name, path in s.items()}


def sample(samples, name: str) -> bytes:
    if name not in samples:
        pytest.skip(f"sample {name} not available")
    return samples[name]


def load(data: bytes) -> Image.Image:
    im = Image.open(io.BytesIO(data))
    im.load()
    return im


def pixels(data: bytes) -> np.ndarray:
    return np.asarray(load(data))


@pytest.mark.parametrize("name", [n for n in ALL_NAMES if n not in BROKEN])
def test_transcode_is_lossless_and_presentable(samples, name):
    src = sample(samples, name)
    prog = to_progressive(src)
    a, b = load(src), load(prog)
    assert b.info.get("progressive") or b.info.get("progression")
    assert a.mode == b.mode and np.array_equal(np.asarray(a), np.asarray(b))
    assert a.getexif().get(ORIENTATION) == b.getexif().get(ORIENTATION)
    assert a.info.get("icc_profile") == b.info.get("icc_profile")

    layers = split_layers(prog)
    assert b"".join(layers) == prog
    assert layers[-1].endswith(EOI)
    assert len(layers) == DEFAULT_LAYERS[a.mode]
    sizes = [len(x) for x in layers]
    previous = 0
    for k in range(1, len(layers) + 1):
        shown = present(layers, k)
        assert shown.endswith(EOI) and len(shown) == presented_size(sizes, k)
        assert len(shown) > previous
        previous = len(shown)
        assert load(shown).size == a.size
    assert present(layers, len(layers)) == prog


def test_markers_survive(samples):
    exif = load(to_progressive(sample(samples, "exif_orient6")))
    assert exif.getexif()[ORIENTATION] == 6
    icc_src = sample(samples, "icc")
    assert load(to_progressive(icc_src)).info["icc_profile"] == load(icc_src).info["icc_profile"]


def test_already_progressive_is_returned_unchanged(samples):
    src = sample(samples, "progressive")
    assert to_progressive(src) is src


@pytest.mark.parametrize("name", ["progressive", "s420", "exif_thumb"])
def test_bytes_after_eoi_are_refused_not_dropped(samples, name):
    """Issue 17.6: the transcode would drop them (a progressive input was "normalised" without them)."""
    src = sample(samples, name)
    assert end_of_image(src) == len(src)  # walked past the thumbnail's FFD9 to the image's own
    with pytest.raises(JpegError, match=r"bytes after EOI \(20\)"):
        to_progressive(src + b"trailing camera junk")


@pytest.mark.parametrize("name", BROKEN)
def test_broken_files_are_refused(samples, name):
    with pytest.raises(JpegError):
        to_progressive(sample(samples, name))


def test_corrupt_entropy_data_is_refused(samples):
    src = sample(samples, "s420")
    sos = src.index(b"\xff\xda")  # no thumbnail in this one, so the first SOS is real
    body = sos + 2 + int.from_bytes(src[sos + 2:sos + 4], "big")
    rng = np.random.default_rng(1)
    noise = rng.integers(0, 255, len(src) - body - 2, dtype=np.uint8).tobytes()  # no 0xFF
    with pytest.raises(JpegError, match="transcoder refused"):
        to_progressive(src[:body] + noise + EOI)


def test_not_a_jpeg():
    for data in (b"", b"\x89PNG\r\n\x1a\n", b"\xff\xd8\x00\x00" + bytes(100)):
        assert not looks_like_jpeg(data[:4])
        with pytest.raises(JpegError, match="not a JPEG"):
            to_progressive(data)
    assert looks_like_jpeg(b"\xff\xd8\xff\xe0")


def test_cmyk_is_transcoded(samples):
    """libturbojpeg 2.1 transcodes Adobe CMYK losslessly (4 components: 18 scans)."""
    src = sample(samples, "cmyk")
    assert load(src).mode == "CMYK"
    layers = split_layers(to_progressive(src))
    assert len(layers) == 18


def test_split_walks_past_fake_scans_in_exif_thumbnail(samples):
    src = sample(samples, "exif_thumb")
    assert src[2:4] == b"\xff\xe1"
    assert src.index(b"\xff\xda") < 4 + int.from_bytes(src[4:6], "big")  # a fake SOS inside APP1
    prog = to_progressive(src)
    layers = split_layers(prog)
    assert len(layers) == 10
    assert prog.count(b"\xff\xda") > len(layers)  # a blind search would cut too often
    assert load(present(layers, 1)).getexif()[ORIENTATION] == 1


def test_split_rejects_non_progressive_and_broken(samples):
    base = sample(samples, "s420")
    with pytest.raises(JpegError, match="not a progressive"):
        split_layers(base)
    prog = to_progressive(base)
    for bad, why in ((prog[:-2], "truncated"), (prog[: len(prog) // 2], "truncated"),
                     (prog + b"x", "after EOI"), (b"GIF89a", "not a JPEG")):
        with pytest.raises(JpegError, match=why):
            split_layers(bad)


def test_present_bounds():
    layers = [b"\xff\xd8head", b"scan", b"last\xff\xd9"]
    assert present(layers, 1) == b"\xff\xd8head\xff\xd9"
    assert present(layers, 3) == present(layers, 99) == b"".join(layers)
    assert presented_size([6, 4, 6], 99) == 16
    assert presented_size([6, 4, 6], 2) == 12
    for f in (lambda: present(layers, 0), lambda: presented_size([1], 0)):
        with pytest.raises(ValueError):
            f()


def test_threads_share_nothing(samples):
    names = [n for n in samples if n not in BROKEN] * 2
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda n: to_progressive(samples[n]), names))
    assert outs == [to_progressive(samples[n]) for n in names]


# --- scan scripts --------------------------------------------------------------------------


@needs_jpegtran
def test_custom_scan_script(samples, tmp_path):
    (tmp_path / "s.txt").write_text(CUSTOM_SCRIPT)
    script = ScanScript.load(tmp_path / "s.txt")
    assert len(script) == 12 and script.components == 3
    for name in ("s420", "exif_orient6", "icc"):
        src = sample(samples, name)
        prog = to_progressive(src, script)
        assert np.array_equal(pixels(prog), pixels(src))
        layers = split_layers(prog)
        assert len(layers) == len(script)
        for k in range(1, len(layers) + 1):
            assert load(present(layers, k)).size == load(src).size
    assert load(to_progressive(sample(samples, "exif_orient6"), script)).getexif()[ORIENTATION] == 6


@needs_jpegtran
def test_colour_script_on_grayscale_uses_luma_scans(samples):
    script = ScanScript(CUSTOM_SCRIPT)
    src = sample(samples, "gray")
    layers = split_layers(to_progressive(src, script))
    assert len(layers) == len(script.fitted(1)) == 7
    assert np.array_equal(pixels(b"".join(layers)), pixels(src))


@needs_jpegtran
def test_custom_script_on_broken_file(samples):
    with pytest.raises(JpegError):
        to_progressive(sample(samples, "truncated"), ScanScript(CUSTOM_SCRIPT))


@pytest.mark.parametrize("text, line, why", [
    ("0,1,2: 0-0, 0, 1;\n0: 1-63, 0, 0;\n1: 1-63 0;\n", 3, "expected"),
    ("0,1,2: 0-0, 0, 0;\n\n0: 1-63, 0, 0;\n1: x-63, 0, 0;\n", 4, "unexpected character"),
    ("0: 0-5, 0, 0;\n", 1, "DC"),
    ("0: 1-63, 0, 0;\n", 1, "before its DC"),
    ("0,1: 0-0, 0, 0;\n0,1: 1-63, 0, 0;\n", 2, "single component"),
    ("1,0: 0-0, 0, 0;\n", 1, "increase"),
    ("0: 0-0, 0, 0;\n0: 1-63, 0, 0;\n0: 1-63, 0, 0;\n", 3, "sent twice"),
    ("0: 0-0, 0, 2;\n0: 1-63, 0, 0;\n0: 0-0, 2, 0;\n", 3, "refinement"),
    ("0: 0-0, 0, 1;\n0: 1-63, 0, 0;\n", 2, "incomplete"),
    ("0: 0-0, 0, 0;\n0: 1-70, 0, 0;\n", 2, "Se"),
    ("0,1,2;\n", 1, "progressive scans only"),
    ("# nothing\n", 1, "empty"),
])
def test_malformed_scan_script(text, line, why):
    with pytest.raises(JpegError, match=f"line {line}: .*{why}"):
        ScanScript(text)


@needs_jpegtran
def test_same_bytes_as_jpegtran(samples):
    """The in-process path is byte-identical to `jpegtran -copy all -optimize -progressive`."""
    for name in ("photo_china", "exif_orient6", "icc", "gray", "cmyk"):
        src = sample(samples, name)
        ref = subprocess.run(["jpegtran", "-copy", "all", "-optimize", "-progressive"], input=src,
                             capture_output=True, check=True).stdout
        assert to_progressive(src) == ref
