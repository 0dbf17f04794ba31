"""``report.md`` and a self-contained ``report.html`` from finished results.

A report is a list of sections, each a title, markdown text (paragraphs and pipe tables)
and PNG figures. The markdown links the figures; the HTML embeds them as base64 so the
single file can be mailed around. Nothing here computes a result.

Two rules hold for every section: no value is printed empty (every pipe table is built
by :func:`markdown_table`, where an empty cell reads ``n/a``; a sentence quotes the paper
only when the paper has a number), and every pipe table of ``report.md`` is an HTML
``<table>`` of ``report.html``, cell for cell.
"""
from __future__ import annotations

import base64
import html
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path

from .. import _io

__all__ = ["READABLE_SCALE", "Section", "markdown_table", "markdown_to_html", "write_report"]


@dataclass
class Section:
    title: str
    text: str = ""
    figures: list[Path] = field(default_factory=list)


def markdown_table(header: list[str], rows: list[list]) -> str:
    """A pipe table: ``| h1 | h2 |``, ``|---|---|``, then one line per row (``None`` and
    empty values as ``n/a``; a ``|`` inside a value is escaped)."""
    def cell(v) -> str:
        text = "" if v is None else str(v).replace("|", "\\|").replace("\n", " ").strip()
        return text or "n/a"

    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


_CELL_SPLIT = re.compile(r"(?<!\\)\|")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in _CELL_SPLIT.split(line.strip().strip("|"))]


def _is_rule(cells: list[str]) -> bool:
    return all(c and set(c) <= set("-: ") for c in cells)


_INLINE = [(re.compile(r"`([^`]+)`"), r"<code>\1</code>"),
           (re.compile(r"\*\*(\S(?:[^*]*\S)?)\*\*"), r"<strong>\1</strong>"),
           (re.compile(r"(?<![\w*])\*(\S(?:[^*]*\S)?)\*(?![\w*])"), r"<em>\1</em>")]


def _inline(text: str) -> str:
    """Escaped HTML of one block's text, with ``code``, **strong** and *emphasis*."""
    out = html.escape(text)
    for pattern, repl in _INLINE:
        out = pattern.sub(repl, out)
    return out.replace("\\|", "|")


def _table_html(lines: list[str]) -> str:
    rows = [_cells(line) for line in lines]
    head, body = rows[0], [r for r in rows[1:] if not _is_rule(r)]
    out = ["<table>", "<tr>" + "".join(f"<th>{_inline(c)}</th>" for c in head) + "</tr>"]
    out += ["<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in body]
    return "\n".join(out + ["</table>"])


def _block_html(kind: str, lines: list[str]) -> str:
    if kind == "table":
        return _table_html(lines)
    if kind == "item":
        return "<ul>" + "".join(f"<li>{_inline(i[2:])}</li>" for i in lines) + "</ul>"
    if kind == "heading":
        return "\n".join(f"<h3>{_inline(h.lstrip('#').strip())}</h3>" for h in lines)
    if kind == "code":
        return "<pre>" + html.escape("\n".join(lines)) + "</pre>"
    return "<p>" + _inline(" ".join(lines)) + "</p>"


def _line_kind(line: str) -> str | None:
    if not line:
        return None
    return {"|": "table", "#": "heading"}.get(line[0], "item" if line.startswith("- ") else "para")


def _blocks(text: str):
    """``(kind, lines)`` blocks; a fenced block (```` ``` ````) keeps its lines verbatim."""
    fenced = text.split("```")
    for k, part in enumerate(fenced):
        if k % 2:  # inside a fence: drop the info string line
            yield "code", part.split("\n", 1)[1].rstrip("\n").splitlines() if "\n" in part else []
            continue
        lines = [line.strip() for line in part.splitlines()]
        for kind, group in itertools.groupby(lines, key=_line_kind):
            if kind is not None:
                yield kind, list(group)


def markdown_to_html(text: str) -> str:
    """The markdown subset the report uses: pipe tables, ``-`` lists, ``#`` headings (as
    ``<h3>``), fenced code, paragraphs with ``code``, **strong** and *emphasis* (which may
    span lines); a block ends at a blank line or where the kind of line changes."""
    return "\n".join(_block_html(kind, lines) for kind, lines in _blocks(text))


def _caption(path: Path) -> str:
    """A readable caption from a figure's file name: ``figure3_infidelity`` ->
    ``Figure 3: infidelity``."""
    words = path.stem.replace("_", " ").replace("-", " ").split()
    if words and re.fullmatch(r"figure\d+", words[0]):
        return f"Figure {words[0][6:]}: " + " ".join(words[1:])
    return " ".join(words).capitalize()


#: At 1280 px and wider: numbers never wrap (a wide table scrolls inside its box), prose
#: keeps a readable line length, figures use the page's width, and a figure whose
#: :data:`READABLE_SCALE` is wider than the page scrolls sideways at that scale.
_STYLE = ("body{font-family:sans-serif;max-width:1600px;margin:2em auto;padding:0 1.5em}"
          "p,ul,ol,h1,h2,h3,figcaption{max-width:1100px}"
          "table{border-collapse:collapse;margin:1em 0;display:block;overflow-x:auto;"
          "max-width:100%}td,th{border:1px solid #bbb;padding:3px 8px;text-align:right}"
          "td{white-space:nowrap;font-variant-numeric:tabular-nums}"
          "td:first-child,th:first-child{text-align:left}th{background:#eee}"
          "figure{margin:1em 0}figure img{display:block;max-width:100%;height:auto}"
          ".wide{overflow-x:auto}.wide img{max-width:none}"
          "figcaption{font-style:italic;margin-bottom:1.5em}"
          "pre{background:#f6f6f6;padding:.5em;overflow-x:auto}")

#: Figures are saved at 150 dpi; shown at 2/3 of their pixels (100 px per inch) their 9 pt
#: titles are 12.5 px tall: the smallest scale at which a saliency grid reads.
READABLE_SCALE = 2 / 3


def _png_width(data: bytes) -> int:
    """A PNG's width in pixels, from its IHDR chunk (0 when not a PNG)."""
    return int.from_bytes(data[16:20], "big") if data[:8] == b"\x89PNG\r\n\x1a\n" else 0


def _figure_html(fig: Path, caption: str) -> str:
    raw = fig.read_bytes()
    readable = round(_png_width(raw) * READABLE_SCALE)
    data = base64.b64encode(raw).decode()
    # wider than the page at a readable scale: shown at that scale, scrolling sideways
    wide = readable > 1100
    figure, size = ('<figure class="wide">', f' style="width:{readable}px"') if wide \
        else ("<figure>", "")
    return (f'{figure}<img alt="{html.escape(fig.stem)}"{size} src="data:image/png;base64,'
            f'{data}"><figcaption>{html.escape(caption)}</figcaption></figure>')


def write_report(out_dir: str | Path, title: str, sections: list[Section]) -> Path:
    """Write ``report.md`` and ``report.html`` under ``out_dir``; returns the markdown path."""
    out = Path(out_dir)
    md = [f"# {title}", ""]
    body = [f"<h1>{html.escape(title)}</h1>"]
    for s in sections:
        text = s.text
        md += [f"## {s.title}", "", text, ""]
        body += [f"<h2>{_inline(s.title)}</h2>", markdown_to_html(text)]
        for fig in s.figures:
            fig = Path(fig)
            caption = _caption(fig)
            md += [f"![{fig.stem}]({fig.relative_to(out).as_posix()})", "", f"*{caption}*", ""]
            body.append(_figure_html(fig, caption))
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
    _io.atomic_write_text(out / "report.html", page)
    return _io.atomic_write_text(out / "report.md", "\n".join(md))
