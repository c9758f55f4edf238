"""tripwire.report(path) and ``tripwire report OUT.html SCRIPT``: a static, self-contained HTML page.

Checked structurally (html.parser): no script, no request to anywhere, a Content-Security-Policy
that forbids both, every user string escaped (a guarded key ``<script>alert(1)</script>`` is
text), every cache and every recompile with its per-entry failures. When chromium is installed the
page is also loaded in headless chromium: its DOM holds no script element and shows the hostile
strings as text (skipped, with the reason, without chromium).
"""

from __future__ import annotations

import gc
import html
import html.parser
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tripwire as tw

# Where the tripwire under test was imported from (site-packages of the installed package, or a
# checkout's python/ in a development tree): the subprocesses import the same one.
_PACKAGE_PARENT = str(Path(tw.__file__).resolve().parent.parent)

HOSTILE = "<script>alert(1)</script>"
HOSTILE_VALUE = "</pre><img src=x onerror=alert(2)>"


class Page(html.parser.HTMLParser):
    """Tags with attributes, text by section, and anything that could load or run."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.sections: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "section":
            self.sections.append(dict(attrs).get("id") or "")

    def handle_data(self, data):
        self.text.append(data)


def parse(path: Path) -> Page:
    p = Page()
    p.feed(path.read_text(encoding="utf-8"))
    p.close()
    return p


@pytest.fixture
def recording():
    previous = tw.record_recompiles(True)
    yield
    tw.record_recompiles(previous)


def lookup(cfg):
    return cfg[HOSTILE]


def double(x, n=2):
    return x * n


@pytest.fixture
def process(recording):
    """Several specialized functions with recompiles, one with a hostile key and values, one
    with a hostile name."""
    f = tw.specialize(lookup)
    f({HOSTILE: "fast"})
    f({HOSTILE: HOSTILE_VALUE})
    g = tw.specialize(double)
    for v in (1, 2, 3, 3):
        g(v)

    def renamed(x):
        return x

    renamed.__qualname__ = "<img src=x onerror=alert(3)>"
    h = tw.specialize(renamed)
    h(1)
    h(2)
    return f, g, h


def assert_inert(page: Page) -> None:
    for tag, attrs in page.tags:
        assert tag not in ("script", "img", "iframe", "object", "embed", "link", "base", "form", "svg")
        for name, value in attrs.items():
            assert not name.startswith("on"), (tag, name)
            if name in ("href", "src", "action", "srcset"):
                assert value is not None and value.startswith("#"), (tag, name, value)
    csp = [
        a.get("content")
        for t, a in page.tags
        if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"
    ]
    assert csp and "default-src 'none'" in csp[0] and "script-src" not in csp[0]


def test_report_structure(process, tmp_path):
    f, g, h = process
    out = tmp_path / "r.html"
    # The report and the summary below must see the same caches: earlier tests' caches that sit
    # in reference cycles die at whichever collection comes next, so collect now and let none
    # run between the two.
    gc.collect()
    collecting = gc.isenabled()
    gc.disable()
    try:
        assert tw.report(out) == str(out)
        s = tw.summary()
    finally:
        if collecting:
            gc.enable()
    page = parse(out)
    assert_inert(page)
    text = "".join(page.text)
    # the hostile key, value and name are there, as text
    assert HOSTILE in text and HOSTILE_VALUE in text and "<img src=x onerror=alert(3)>" in text
    raw = out.read_text()
    assert HOSTILE not in raw and "<img" not in raw
    assert html.escape(HOSTILE) in raw
    # every cache has its section, linked from the overview table
    assert len(page.sections) == len(s.caches)
    anchors = {a["href"] for t, a in page.tags if t == "a"}
    assert anchors == {f"#{sid}" for sid in page.sections}
    # per recompile: one row per entry cached at the time, with the failing guard's reason
    assert f"L['cfg']['{HOSTILE}']: EQUALS_MATCH expected 'fast', got '{HOSTILE_VALUE}'" in text
    assert (
        "L['x']: EQUALS_MATCH expected 2, got 3" in text and "L['x']: EQUALS_MATCH expected 1, got 3" in text
    )
    assert text.count("first compile: nothing cached") >= 3
    # the guard trees, with install sites
    assert f"EQUALS_MATCH: L['cfg']['{HOSTILE}'] == 'fast'" in text
    assert "installed at" in text and __file__.lstrip("/") in text


def failure_rows(path: Path) -> list[list[str]]:
    """The rows of the recompile tables (cached entry, why, installed at), as text."""

    class Rows(html.parser.HTMLParser):
        def __init__(self):
            super().__init__(convert_charrefs=True)
            self.rows, self.row, self.cell, self.depth = [], None, None, 0

        def handle_starttag(self, tag, attrs):
            if tag == "tr":
                self.row = []
            elif tag == "td" and self.row is not None:
                self.cell = []

        def handle_endtag(self, tag):
            if tag == "td" and self.cell is not None:
                self.row.append("".join(self.cell))
                self.cell = None
            elif tag == "tr" and self.row is not None:
                self.rows.append(self.row)
                self.row = None

        def handle_data(self, data):
            if self.cell is not None:
                self.cell.append(data)

    p = Rows()
    p.feed(path.read_text())
    return [r for r in p.rows if len(r) == 3]


def test_failures_per_entry(recording, tmp_path):
    g = tw.specialize(double)
    for v in (1, 2, 3):
        g(v)
    g(1, n=5)
    out = tmp_path / "r.html"
    tw.report(out)
    rows = [r for r in failure_rows(out) if r[0].startswith("double#")]
    # compiles 2, 3, 4 explain 1, 2, 3 cached entries
    assert [r[0] for r in rows][-6:] == [
        "double#0",
        "double#1",
        "double#0",
        "double#2",
        "double#1",
        "double#0",
    ]
    assert rows[-1][1] == "L['n']: EQUALS_MATCH expected 2, got 5 (L['n'] == 2 is false)"
    # the innermost site first (the whole stack below it, innermost last)
    assert (
        rows[-1][2].startswith(f"{__file__}:")
        and "in test_failures_per_entry" in rows[-1][2].split("stack")[0]
    )


def test_empty_process_report(tmp_path):
    out = tmp_path / "empty.html"
    tw.report(out, title="nothing <here>")
    page = parse(out)
    assert_inert(page)
    assert "nothing <here>" in "".join(page.text)


def test_report_command_runs_a_script(tmp_path):
    script = tmp_path / "user.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            import tripwire as tw

            @tw.specialize
            def area(w, h):
                return w * h

            area(1, 2); area(1, 2); area(3, 2)
            print("args", sys.argv[1:])
            sys.exit(3)
            """
        )
    )
    out = tmp_path / "cli.html"
    proc = subprocess.run(
        [sys.executable, "-m", "tripwire", "report", str(out), str(script), "--flag", "x"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": _PACKAGE_PARENT, "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 3, proc.stderr
    assert "args ['--flag', 'x']" in proc.stdout
    assert f"report written to {out}" in proc.stderr
    page = parse(out)
    assert_inert(page)
    text = "".join(page.text)
    assert "area" in text and "1 hits" in text
    # the command records recompile reasons
    assert "L['w']: EQUALS_MATCH expected 1, got 3" in text


def test_report_command_imports_beside_the_script_and_refuses_a_missing_one(tmp_path):
    (tmp_path / "helper_mod.py").write_text("VALUE = 41\n")
    script = tmp_path / "uses_helper.py"
    script.write_text("import helper_mod\nprint(helper_mod.VALUE + 1)\n")
    env = {"PYTHONPATH": _PACKAGE_PARENT, "PATH": "/usr/bin:/bin"}
    run = [sys.executable, "-m", "tripwire", "report", str(tmp_path / "h.html")]
    proc = subprocess.run([*run, str(script)], capture_output=True, text=True, timeout=120, env=env, cwd="/")
    assert proc.returncode == 0 and proc.stdout.strip() == "42", proc.stderr
    proc = subprocess.run(
        [*run, str(tmp_path / "missing.py")], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"tripwire report: {tmp_path / 'missing.py'}: no such file"


def test_report_command_script_raises(tmp_path):
    script = tmp_path / "boom.py"
    script.write_text(
        "import tripwire as tw\nf = tw.specialize(lambda x: x)\nf(1)\nraise ValueError('boom')\n"
    )
    out = tmp_path / "boom.html"
    proc = subprocess.run(
        [sys.executable, "-m", "tripwire", "report", str(out), str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": _PACKAGE_PARENT, "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 1
    assert "ValueError: boom" in proc.stderr
    assert "<lambda>" in "".join(parse(out).text)


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "chromium-headless-shell", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no chromium on PATH (apt-get install chromium): the structural checks above still ran")


def test_in_headless_chromium(process, tmp_path):
    browser = chromium()
    out = tmp_path / "r.html"
    tw.report(out)
    args = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    dom = subprocess.run([*args, "--dump-dom", out.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = Page()
    page.feed(dom.stdout)
    assert page.tags, dom.stderr[-2000:]
    assert_inert(page)
    text = "".join(page.text)
    assert HOSTILE in text and HOSTILE_VALUE in text
    shot = tmp_path / "r.png"
    subprocess.run(
        [*args, f"--screenshot={shot}", "--window-size=1200,900", out.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
