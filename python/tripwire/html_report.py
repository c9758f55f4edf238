"""A static HTML report of every cache in the process: ``tripwire.report(path)``.

One self-contained page (inline CSS, no script, no request: its Content-Security-Policy forbids
both), in the spirit of torch's tlparse: a table of every cache with its counts, then per cache
its entries (each guard set as ``explain()`` prints it, with where each guard was installed) and
its compile history, each compile with why every entry then cached did not match the call.
Every string that comes from the process (names, sources, reasons, reprs of values, paths) is
HTML-escaped, so a guarded key like ``"<script>"`` shows as text. The data is
:func:`tripwire.summary`'s (with guard trees).

From the command line, ``tripwire report OUT.html SCRIPT [ARGS...]`` runs a Python script with
:func:`tripwire.record_recompiles` on and writes the report of its caches when it ends (even by an
exception).
"""

from __future__ import annotations

import datetime
import html
import os
import platform
from collections.abc import Iterable

from .overview import CacheSummary, Summary, summary

__all__ = ["render", "report"]

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222;
       padding: 0 1em; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.15em; margin: 2em 0 0.4em; border-bottom: 1px solid #ccc; padding-bottom: 0.2em; }
h3 { font-size: 1em; margin: 1.2em 0 0.3em; }
.meta { color: #666; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f7f7f7; border: 1px solid #e3e3e3; padding: 0.6em; overflow-x: auto;
      font-size: 12px; white-space: pre; }
code { font-size: 12px; }
.fail { color: #a40000; }
.pass { color: #2a7a2a; }
.kind { display: inline-block; font-size: 11px; padding: 0 0.4em; border-radius: 3px;
        background: #e8eef7; color: #234; margin-right: 0.4em; }
details { margin: 0.3em 0; }
summary { cursor: pointer; }
ol.compiles > li { margin-bottom: 0.8em; }
"""


def _e(value: object) -> str:
    """Escape for text and for quoted attributes alike."""
    return html.escape(str(value), quote=True)


def _cell(value: object, numeric: bool = False) -> str:
    return f'<td class="n">{_e(value)}</td>' if numeric else f"<td>{_e(value)}</td>"


def _overview(s: Summary) -> Iterable[str]:
    yield "<table><tr><th>#</th><th>cache</th><th>entries</th><th>hits</th><th>misses</th>"
    yield "<th>compiles</th><th>compile time (s)</th><th>recompiles</th></tr>"
    for i, c in enumerate(s.caches):
        label = f'<a href="#cache-{i}">{_e(c.name)}</a>'
        where = f' <span class="meta">{_e(c.where)}</span>' if c.where else ""
        yield (
            f'<tr><td class="n">{i}</td><td><span class="kind">{_e(c.kind)}</span>{label}{where}</td>'
            + _cell(len(c.entries), True)
            + _cell(c.hits, True)
            + _cell(c.misses, True)
            + _cell(c.compile_count, True)
            + _cell(f"{c.compile_seconds:.3f}", True)
            + _cell(c.recompiles, True)
            + "</tr>"
        )
    yield "</table>"


def _cache(i: int, c: CacheSummary) -> Iterable[str]:
    yield f'<section id="cache-{i}"><h2><span class="kind">{_e(c.kind)}</span>{_e(c.name)}</h2>'
    facts = [("where", c.where), ("backend", c.backend)]
    yield '<p class="meta">' + " &middot; ".join(f"{k}: {_e(v)}" for k, v in facts if v) + "</p>"
    yield (
        f"<p>{len(c.entries)} entries, {c.hits} hits, {c.misses} misses, {c.compile_count} compiles "
        f"in {c.compile_seconds:.3f} s, {c.recompiles} recompiles, {c.evictions} evictions, "
        f"{c.invalidations} invalidations</p>"
    )
    yield "<h3>Entries (most recently used first)</h3>"
    if not c.entries:
        yield "<p>none</p>"
    for n, e in enumerate(c.entries):
        yield (
            # the most recently used entry open: its guard tree is what a reader looks for first
            f"<details{' open' if n == 0 else ''}><summary><code>{_e(e.name)}</code>: {e.hits} hits, {e.guards} guards</summary>"
            f"<pre>{_e(e.explain or '')}</pre></details>"
        )
    yield "<h3>Compiles (oldest first)</h3>"
    if c.compile_count > len(c.compiles):
        yield f'<p class="meta">the last {len(c.compiles)} of {c.compile_count}</p>'
    if not c.compiles:
        yield "<p>none recorded</p>"
        yield "</section>"
        return
    yield '<ol class="compiles">'
    for r in c.compiles:
        at = datetime.datetime.fromtimestamp(r.at).strftime("%Y-%m-%d %H:%M:%S")
        took = "" if r.seconds is None else f", {r.seconds * 1000:.1f} ms"
        yield f'<li><code>{_e(r.entry)}</code> <span class="meta">{_e(at)}{_e(took)}</span>'
        if r.reasons is None:
            yield " (why the cached entries missed was not recorded: tripwire.record_recompiles())</li>"
            continue
        if not r.reasons:
            yield " (first compile: nothing cached)</li>"
            continue
        yield "<table><tr><th>cached entry</th><th>why it did not match</th><th>guard installed at</th></tr>"
        for reason in r.reasons:
            if reason.reason is None:
                why = '<td class="pass">matched (another entry was preferred)</td>'
            else:
                why = f'<td class="fail">{_e(reason.reason)}</td>'
            sites = reason.installed_at
            where = f"<code>{_e(sites[-1])}</code>" if sites else ""  # the innermost frame
            if len(sites) > 1:
                where += "<details><summary>stack</summary><pre>" + _e("\n".join(sites)) + "</pre></details>"
            yield f"<tr><td><code>{_e(reason.entry)}</code></td>{why}<td>{where}</td></tr>"
        yield "</table></li>"
    yield "</ol></section>"


def render(s: Summary, *, title: str = "tripwire report") -> str:
    """The report's HTML for a summary made with ``guards=True``."""
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        # No script, no request of any kind: the page is data, whatever strings it holds.
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'\">",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        f'<p class="meta">{_e(now)} &middot; pid {os.getpid()} &middot; '
        f"{_e(platform.python_implementation())} {_e(platform.python_version())}</p>",
        f"<p>{len(s.caches)} caches, {s.entries} entries, {s.hits} hits, {s.misses} misses, "
        f"{s.compile_count} compiles in {s.compile_seconds:.3f} s, {s.recompiles} recompiles"
        + (f"; {s.empty} empty caches not shown" if s.empty else "")
        + "</p>",
    ]
    if s.caches:
        parts.extend(_overview(s))
    else:
        parts.append("<p>No cache holds an entry yet.</p>")
    for i, c in enumerate(s.caches):
        parts.extend(_cache(i, c))
    parts.append("</body></html>\n")
    return "\n".join(parts)


def report(path: str | os.PathLike[str], *, title: str = "tripwire report") -> str:
    """Write the HTML report of every live cache to ``path`` (UTF-8); returns the path."""
    text = render(summary(guards=True), title=title)
    # backslashreplace: a lone surrogate in a name must not lose the whole report
    with open(path, "w", encoding="utf-8", errors="backslashreplace") as f:
        f.write(text)
    return os.fspath(path)


def run_and_report(out: str, argv: list[str]) -> int:
    """``tripwire report OUT.html SCRIPT [ARGS...]``: run SCRIPT as ``__main__`` with ``argv``,
    then write the report, also when the script raised or exited. Returns the script's exit
    status (1 for an exception, which propagates after the report is written)."""
    import runpy
    import sys

    from .cache import record_recompiles

    script = argv[0]
    if not os.path.isfile(script):
        print(f"tripwire report: {script}: no such file", file=sys.stderr)
        return 2
    record_recompiles(True)
    saved = sys.argv[:], sys.path[:]
    # As `python SCRIPT` runs it: its arguments, and its own directory first on the path.
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    status = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv, sys.path[:] = saved
        report(out)
        print(f"tripwire: report written to {out}", file=sys.stderr)
    return status
