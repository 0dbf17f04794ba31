"""Reading IDX files, the binary format of the MNIST distribution.

Layout: ``00 00 <dtype code> <d>``, then ``d`` big-endian uint32 sizes, then exactly
``prod(sizes)`` big-endian items; gzipped files are recognised by their magic bytes.
"""
from __future__ import annotations

import gzip
import math
import os
import zlib
from pathlib import Path

import numpy as np

__all__ = ["read_idx"]

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
