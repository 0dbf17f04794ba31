"""``taylorattr cache info|clear``: the captures kept on disk (:mod:`taylorattr.capture_cache`):
where they are, how many and how large; or delete them all."""
from __future__ import annotations


def arguments(p, method_help: bool) -> None:
    p.add_argument("action", choices=["info", "clear"],
                   help="info: folder, entries and size; clear: delete every entry")


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def run(args) -> str:
    from ... import capture_cache  # torch: after parsing, not for --help

    if args.action == "clear":
        count = capture_cache.clear()
        return f"deleted {count} cached capture(s) from {capture_cache.directory()}"
    info = capture_cache.info()
    state = "on" if info["enabled"] else \
        f"off ({capture_cache.ENV_SWITCH}=0: captures are not kept on disk)"
    return "\n".join([f"folder:  {info['directory']} (moved by ${capture_cache.ENV_DIR})",
                      f"cache:   {state}",
                      f"entries: {info['entries']}",
                      f"size:    {_size(info['bytes'])}"])
