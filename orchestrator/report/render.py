"""A report's sections rendered: HTML with the plots embedded as base64 PNGs, Markdown with links
to the PNGs beside it, and the one way a number becomes a table cell.

A section is (heading, [blocks]); a block is ("text", str), ("table", header, rows) or ("image", file name).
"""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path


def number_cell(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, str) and not value):
        return ""
    value = float(value)
    if math.isnan(value):
        return "-"
    if math.isinf(value):
        return "never" if value < 0 else "whole grid"
    return f"{value:.{digits}f}"


def render_html(title: str, sections: list, out: Path) -> str:
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse;font-size:12px;margin:.5em 0}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}td:first-child{text-align:left}"
        "img{max-width:100%}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    for heading, blocks in sections:
        parts.append(f"<h2>{html.escape(heading)}</h2>")
        for block in blocks:
            if block[0] == "text":
                parts.append(f"<p>{html.escape(block[1])}</p>")
            elif block[0] == "table":
                head = "".join(f"<th>{html.escape(str(h))}</th>" for h in block[1])
                body = "".join(
                    "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in block[2]
                )
                parts.append(f"<table><tr>{head}</tr>{body}</table>")
            else:
                data = base64.b64encode((out / block[1]).read_bytes()).decode("ascii")
                parts.append(f"<p><img alt='{html.escape(block[1])}' src='data:image/png;base64,{data}'></p>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def render_markdown(title: str, sections: list, out: Path, report_dir: Path) -> str:
    lines = [f"# {title}", ""]
    for heading, blocks in sections:
        lines += [f"## {heading}", ""]
        for block in blocks:
            if block[0] == "text":
                lines += [block[1], ""]
            elif block[0] == "table":
                lines.append("| " + " | ".join(_md_cell(h) for h in block[1]) + " |")
                lines.append("|" + "---|" * len(block[1]))
                lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in block[2]]
                lines.append("")
            else:
                image = Path(out / block[1]).resolve()
                try:
                    link = image.relative_to(report_dir.resolve())
                except ValueError:
                    link = image
                lines += [f"![{block[1]}]({link})", ""]
    return "\n".join(lines)


def _md_cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")
