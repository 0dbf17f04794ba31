"""Image files and the photos shipped with installed packages, for demos.

Reading rejects unreadable files with a ``ValueError`` naming the file; nothing is downloaded.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

__all__ = ["image_files_pillow_reads", "load_image", "sample_photos"]


def _open_image(path: Path):
    from PIL import Image, UnidentifiedImageError

    if not path.is_file():
        raise FileNotFoundError(f"image file not found: {path}")
    try:
        with Image.open(path) as img:
            img.load()
            return img.convert("RGB")
    except UnidentifiedImageError:
        raise ValueError(f"{path}: not an image Pillow can read (an unknown format, or the "
                         "file is damaged or empty)") from None
    except Image.DecompressionBombError as exc:
        raise ValueError(f"{path}: too large to read safely ({exc})") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise ValueError(f"{path}: damaged image ({' '.join(str(exc).split())})") from None


def image_files_pillow_reads(root: str | os.PathLike) -> tuple[list[Path], list[Path]]:
    """``(images, skipped)``: the files at any depth under ``root`` (sorted) whose suffix is
    one Pillow reads (``PIL.Image.registered_extensions()``: PNG, JPEG, WebP, TIFF, BMP,
    GIF, ...), and the other files, which are not images (Pascal-VOC ``.xml`` boxes and
    hidden files and folders, such as ``.DS_Store``, are neither); ValueError when there is
    no image."""
    from PIL import Image

    root = Path(root)
    readable = {s.lower() for s in Image.registered_extensions()}
    images, skipped = [], []
    for p in sorted(root.rglob("*")):
        if not p.is_file() or any(part.startswith(".") for part in p.relative_to(root).parts):
            continue
        if p.suffix.lower() in readable:
            images.append(p)
        elif p.suffix.lower() != ".xml":
            skipped.append(p)
    if not images:
        raise ValueError(f"data: no image Pillow reads (PNG, JPEG, WebP, TIFF, BMP, ...) "
                         f"under {root}")
    return images, skipped


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
