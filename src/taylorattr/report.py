"""``report.md`` and a self-contained ``report.html`` from finished results.

A report is a list of sections, each a title, markdown text (paragraphs and pipe tables)
and PNG figures. The markdown links the figures; the HTML embeds them as base64 so the
single file can be mailed around. Nothing here computes a result.
"""
from __future__ import annotations

import base64
import html
import itertools
from dataclasses import dataclass, field
from pathlib import Path

from . import _io

__all__ = ["Section", "markdown_to_html", "write_report"]


@dataclass
class Section:
    title: str
    text: str = ""
    figures: list[Path] = field(default_factory=list)


def _table_html(lines: list[str]) -> str:
    rows = [[html.escape(c.strip()) for c in line.strip().strip("|").split("|")] for line in lines]
    head, body = rows[0], [r for r in rows[1:] if not all(set(c) <= set("-: ") for c in r)]
    out = ["<table>", "<tr>" + "".join(f"<th>{c}</th>" for c in head) + "</tr>"]
    out += ["<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in body]
    return "\n".join(out + ["</table>"])


def _block_html(kind: str, lines: list[str]) -> str:
    if kind == "table":
        return _table_html(lines)
    if kind == "item":
        return "<ul>" + "".join(f"<li>{html.escape(i[2:])}</li>" for i in lines) + "</ul>"
    if kind == "heading":
        return "\n".join(f"<h3>{html.escape(h.lstrip('#').strip())}</h3>" for h in lines)
    return "<p>" + html.escape(" ".join(lines)) + "</p>"


def _line_kind(line: str) -> str | None:
    if not line:
        return None
    return {"|": "table", "#": "heading"}.get(line[0], "item" if line.startswith("- ") else "para")


def markdown_to_html(text: str) -> str:
    """The markdown subset the report uses: pipe tables, ``-`` lists, ``#`` headings (as
    ``<h3>``) and paragraphs; a block ends at a blank line or where the kind of line changes."""
    lines = [line.strip() for line in text.splitlines()]
    blocks = [_block_html(kind, list(group))
              for kind, group in itertools.groupby(lines, key=_line_kind) if kind is not None]
    return "\n".join(blocks)


_STYLE = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
          "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #bbb;padding:3px 8px;"
          "text-align:right}th{background:#eee}img{max-width:100%}")


def write_report(out_dir: str | Path, title: str, sections: list[Section]) -> Path:
    """Write ``report.md`` and ``report.html`` under ``out_dir``; returns the markdown path."""
    out = Path(out_dir)
    md = [f"# {title}", ""]
    body = [f"<h1>{html.escape(title)}</h1>"]
    for s in sections:
        md += [f"## {s.title}", "", s.text, ""]
        body += [f"<h2>{html.escape(s.title)}</h2>", markdown_to_html(s.text)]
        for fig in s.figures:
            fig = Path(fig)
            md += [f"![{fig.stem}]({fig.relative_to(out).as_posix()})", ""]
            data = base64.b64encode(fig.read_bytes()).decode()
            body.append(f'<img alt="{html.escape(fig.stem)}" src="data:image/png;base64,{data}">')
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
    _io.atomic_write_text(out / "report.html", page)
    return _io.atomic_write_text(out / "report.md", "\n".join(md))
