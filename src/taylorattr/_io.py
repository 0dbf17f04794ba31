"""Atomic file writes and safe loads.

Every writer here puts the bytes into a temporary file in the destination folder
(``.<name>.<host>-<pid>.<random>.tmp``), flushes and fsyncs it, then renames it over the
destination with ``os.replace``, which is atomic on POSIX and Windows. A reader therefore
sees the old file or the complete new one, never a partial write, even if the process is
killed (SIGKILL) mid-write. A killed writer can leave its hidden ``.tmp`` file behind;
:func:`remove_stale_temporaries` deletes those, and only those (not the temporaries of a
writer still running, e.g. another rank of a torchrun job writing into the same folder).

Tensors and state dicts are loaded with ``torch.load(weights_only=True)``: a file that
holds anything but tensors and plain containers is refused instead of unpickled.
"""
from __future__ import annotations

import contextlib
import csv
import glob
import hashlib
import io
import json
import os
import pickle
import socket
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "atomic_path",
    "atomic_write_bytes",
    "atomic_write_text",
    "load_csv",
    "load_json",
    "load_tensors",
    "on_cpu",
    "remove_stale_temporaries",
    "save_csv",
    "save_json",
    "save_npy",
    "save_tensors",
]

_TMP_SUFFIX = ".tmp"


def _host() -> str:
    return socket.gethostname().replace(".", "_").replace("-", "_") or "host"


def _writer() -> str:
    """``host-pid`` of the writing process, part of its temporaries' names, so a cleanup
    can tell a killed writer's file from a live one's (another rank's, say)."""
    return f"{_host()}-{os.getpid()}"


def _live_writer(tmp: Path) -> bool:
    """Whether ``tmp`` (``.{name}.{host}-{pid}.{random}.tmp``) may still be written: its
    writer runs on this host, or it was written on another host (which cannot be asked).
    Temporaries without a writer tag are stale."""
    parts = tmp.name[:-len(_TMP_SUFFIX)].rsplit(".", 2)
    host, _, pid = parts[1].rpartition("-") if len(parts) == 3 else ("", "", "")
    if not host or not pid.isdigit():
        return False
    if host != _host():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it onto ``path``.

    The caller writes the whole file to the yielded path. If the block raises, the
    temporary file is removed and ``path`` is left untouched. The parent folder is
    created when missing.
    """
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.{_writer()}.",
                                    suffix=_TMP_SUFFIX)
    os.close(fd)
    tmp = Path(tmp_name)
    with contextlib.suppress(OSError):
        os.chmod(tmp, 0o644)  # mkstemp makes 0600 files; results are meant to be shared
    try:
        yield tmp
        _fsync_file(tmp)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as fh:
        fh.flush()
        os.fsync(fh.fileno())


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; returns the destination path."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically; returns the destination path."""
    return atomic_write_bytes(path, text.encode(encoding))


def on_cpu(value: Any) -> Any:
    """``value`` with every tensor (in dicts, lists and tuples) detached and on the CPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: on_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(on_cpu(v) for v in value)
    return value


def save_tensors(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save`` a tensor, a state dict or a container of tensors atomically, every
    tensor on the CPU (:func:`on_cpu`): a file written from a GPU run loads, with plain
    ``torch.load`` too, on a machine without one.

    Keep ``obj`` to what ``torch.load(weights_only=True)`` accepts (tensors, numbers,
    strings, lists, tuples, dicts), or :func:`load_tensors` will refuse it.
    """
    buf = io.BytesIO()
    torch.save(on_cpu(obj), buf)
    return atomic_write_bytes(path, buf.getvalue())


def save_npy(array, path: str | os.PathLike) -> Path:
    """``numpy.save`` an array (or a tensor, moved to the CPU) atomically."""
    import numpy as np  # numpy comes with torch; only this writer needs it

    if isinstance(array, torch.Tensor):
        array = array.detach().cpu().numpy()
    buf = io.BytesIO()
    np.save(buf, np.asarray(array))
    return atomic_write_bytes(path, buf.getvalue())


def load_tensors(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> Any:
    """Load what :func:`save_tensors` wrote, with ``torch.load(weights_only=True)``.

    Raises ``FileNotFoundError`` when the file is missing and ``ValueError`` (naming the
    file) when it is not a weights-only torch file (corrupt, truncated, or holding
    arbitrary pickled objects).
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no such tensor file: {p}")
    try:
        return torch.load(p, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        if "Weights only load failed" not in str(exc):
            raise ValueError(f"{p} is not a readable weights-only torch file (corrupt or "
                             "truncated): "
                             f"{' '.join(str(exc).split())[:200]}") from None
        # torch's own text is long, coloured and about its Python API
        raise ValueError(
            f"{p} is not a weights-only torch file: it holds pickled Python objects (a whole "
            "saved model?), which are not loaded because unpickling can run code; save "
            "model.state_dict() with torch.save and give that file") from None
    except (RuntimeError, EOFError, ValueError, AttributeError,
            TypeError, OSError) as exc:
        raise ValueError(
            f"{p} is not a readable weights-only torch file (corrupt, truncated, or it holds "
            f"objects other than tensors): {exc}"
        ) from None


def save_json(obj: Any, path: str | os.PathLike) -> Path:
    """Write ``obj`` as indented, key-sorted JSON atomically."""
    text = json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n"
    return atomic_write_text(path, text)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    try:  # numpy scalars and arrays
        return obj.tolist()
    except AttributeError:
        raise TypeError(f"object of type {type(obj).__name__} is not JSON serialisable") from None


def load_json(path: str | os.PathLike) -> Any:
    """Read a JSON file; ``ValueError`` naming the file when it is not valid JSON."""
    p = Path(path)
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{p} is not valid JSON: {exc}") from None


def save_csv(
    rows: Sequence[Mapping[str, Any]],
    path: str | os.PathLike,
    fieldnames: Sequence[str] | None = None,
) -> Path:
    """Write a list of dicts as CSV with a header row, atomically.

    ``fieldnames`` defaults to the keys in order of first appearance across ``rows``;
    a missing value is written as an empty cell.
    """
    if fieldnames is None:
        seen: dict[str, None] = {}
        for row in rows:
            for key in row:
                seen.setdefault(key, None)
        fieldnames = list(seen)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(fieldnames), restval="", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(dict(row))
    return atomic_write_text(path, out.getvalue())


def load_csv(path: str | os.PathLike) -> list[dict[str, str]]:
    """Read a CSV with a header row into a list of dicts (all values as strings)."""
    p = Path(path)
    with open(p, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def remove_stale_temporaries(folder: str | os.PathLike, name: str | None = None) -> list[Path]:
    """Delete the hidden ``.*.tmp`` files a killed writer left in ``folder``.

    With ``name``, only the temporaries of the destination file ``folder/name``
    (``.{name}.*.tmp``). The temporaries of a writer still running on this host (another
    rank writing beside this one), or written on another host, are left alone: each name
    carries its writer's host and pid. Returns the paths removed.
    """
    removed: list[Path] = []
    d = Path(folder)
    if not d.is_dir():
        return removed
    pattern = f".{glob.escape(name)}.*{_TMP_SUFFIX}" if name else f".*{_TMP_SUFFIX}"
    for p in d.glob(pattern):
        if p.is_file() and not _live_writer(p):
            with contextlib.suppress(OSError):
                p.unlink()
                removed.append(p)
    return removed


def fingerprint(named_tensors) -> str:
    """A short hash of ``(name, tensor)`` pairs (shapes, dtypes and bytes), for cache keys:
    a result computed on other data or weights is never reused."""
    h = hashlib.sha1()
    for name, t in named_tensors:
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:12]
