"""One job per output folder: a lock file naming its holder's host and pid.

``JobLock(folder).acquire()`` creates ``folder/.taylorattr.lock`` with ``O_CREAT |
O_EXCL`` (atomic: of two jobs racing, exactly one creates it) holding
``{"host", "pid", "started"}``. A second job finds the file and is refused with a
:class:`LockHeld` error naming the holder. A lock is *stale* when its holder ran on this
host and that pid no longer exists (the job was killed, e.g. SIGKILL, before it could
remove the file): it is taken over, and :attr:`JobLock.stale` records the dead holder.
A lock from another host cannot be checked from here; the error says to delete the
file if that job is known to be gone. ``release()`` removes the file only while it is
still ours.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path

__all__ = ["LOCK_NAME", "JobLock", "LockHeld"]

LOCK_NAME = ".taylorattr.lock"


class LockHeld(RuntimeError):
    """Another live job holds the output folder."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class JobLock:
    """The lock of ``folder`` (see the module docstring); a context manager."""

    def __init__(self, folder: str | os.PathLike):
        self.path = Path(folder) / LOCK_NAME
        self.stale: dict | None = None
        self._mine: dict | None = None

    def holder(self) -> dict | None:
        """The holder recorded in the lock file, or None when there is none."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        try:
            info = json.loads(text)
            return {"host": str(info["host"]), "pid": int(info["pid"]),
                    "started": str(info.get("started", "?"))}
        except (ValueError, KeyError, TypeError):
            return {"host": "?", "pid": -1, "started": "?", "unreadable": text[:80]}

    def acquire(self) -> JobLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = {"host": socket.gethostname(), "pid": os.getpid(),
              "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                held = self.holder()
                if held is None:
                    continue  # released between our open and read
                if held["host"] == me["host"] and held["pid"] > 0 and not _alive(held["pid"]):
                    self.stale = held
                    with contextlib.suppress(FileNotFoundError):
                        self.path.unlink()
                    continue
                if held["pid"] < 0:
                    raise LockHeld(f"{self.path} exists but is unreadable; delete it if no job "
                                   "is running on this folder") from None
                where = "this host" if held["host"] == me["host"] else f"host {held['host']}"
                raise LockHeld(
                    f"{self.path.parent} is in use by another job: pid {held['pid']} on "
                    f"{held['host']} (started {held['started']}); wait for it, choose another "
                    f"--out, or delete {self.path} if that process is gone from {where}"
                ) from None
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(me, fh)
                fh.flush()
                os.fsync(fh.fileno())
            self._mine = me
            return self
        raise LockHeld(f"could not take {self.path}: other jobs keep taking it")

    def release(self) -> None:
        if self._mine is None:
            return
        held = self.holder()
        if held is not None and held["pid"] == self._mine["pid"] \
                and held["host"] == self._mine["host"]:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        self._mine = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
