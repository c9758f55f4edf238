"""Recompile reasons: format_recompile, the tripwire.recompiles logger, TRIPWIRE_LOGS, RecompileError."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys

import pytest

import tripwire as tw
from tripwire import logs


def install_guards(example):
    # The install site the reason must show: this function's frame.
    b = tw.GuardBuilder(example)
    b.type_match("L['x']")
    b.equals("L['cfg']['mode']")
    return b.build()


def sample_fn(x, cfg):
    return x


@pytest.fixture(autouse=True)
def _reset_logs():
    yield
    tw.set_logs("")


def failures_for(new_locals):
    gs = install_guards({"x": 1, "cfg": {"mode": "fast"}})
    f = gs.why_not(new_locals)
    assert f is not None
    return [f]


def test_format_names_function_file_line_source_expected_actual_and_install_site():
    msg = tw.format_recompile(sample_fn, failures_for({"x": 1, "cfg": {"mode": "slow"}}), names=["e0"])
    code = sample_fn.__code__
    assert msg.startswith(f"Recompiling function sample_fn in {code.co_filename}:{code.co_firstlineno}")
    assert "entry 0 'e0'" in msg
    assert "source: L['cfg']['mode']" in msg
    assert "kind: EQUALS_MATCH" in msg
    assert "expected: 'fast'" in msg and "actual: 'slow'" in msg
    assert "guard installed at (innermost last):" in msg
    site_lines = [ln.strip() for ln in msg.splitlines() if ln.startswith("          ")]
    assert site_lines, msg
    # innermost last: the builder call in install_guards, called from failures_for
    assert site_lines[-1].startswith(f"{__file__}:") and site_lines[-1].endswith("in install_guards")
    assert any(s.endswith("in failures_for") for s in site_lines)


def test_format_type_failure_and_several_entries():
    f1 = failures_for({"x": "s", "cfg": {"mode": "fast"}})[0]
    f2 = failures_for({"x": 1, "cfg": {"mode": "slow"}})[0]
    msg = tw.format_recompile(sample_fn, [f1, f2])
    assert "entry 0: " in msg and "entry 1: " in msg
    assert "kind: TYPE_MATCH" in msg and "actual: <class 'str'>" in msg
    assert msg.index("TYPE_MATCH") < msg.index("EQUALS_MATCH")


def test_format_without_code_object_and_without_entries():
    msg = tw.format_recompile(len, [])
    assert "Recompiling function len in <unknown>" in msg
    assert "(no cached entry)" in msg


def test_report_logs_at_info_when_enabled(caplog):
    fails = failures_for({"x": 1, "cfg": {"mode": "slow"}})
    with caplog.at_level(logging.INFO, logger="tripwire.recompiles"):
        msg = logs.report_recompile(sample_fn, fails)
    assert msg is not None
    recs = [r for r in caplog.records if r.name == "tripwire.recompiles"]
    assert len(recs) == 1 and recs[0].levelno == logging.INFO
    assert recs[0].getMessage() == msg
    assert "L['cfg']['mode']" in msg


def test_report_formats_nothing_when_disabled(caplog):
    fails = failures_for({"x": 1, "cfg": {"mode": "slow"}})
    with caplog.at_level(logging.WARNING, logger="tripwire.recompiles"):
        assert logs.report_recompile(sample_fn, fails) is None
    assert not [r for r in caplog.records if r.name == "tripwire.recompiles"]


def test_report_error_raises_recompile_error():
    fails = failures_for({"x": 1, "cfg": {"mode": "slow"}})
    with pytest.raises(tw.RecompileError) as ei:
        logs.report_recompile(sample_fn, fails, error=True)
    assert isinstance(ei.value, tw.TripwireError)
    assert "Recompiling function sample_fn" in str(ei.value)
    assert ei.value.failures == tuple(fails)


def test_parse_logs():
    assert logs.parse_logs("recompiles") == {"recompiles"}
    assert logs.parse_logs(" Recompiles , ,") == {"recompiles"}
    assert logs.parse_logs("") == frozenset()
    assert logs.parse_logs(None) == frozenset()
    assert logs.parse_logs(["recompiles"]) == {"recompiles"}
    assert logs.parse_logs("+recompiles,-guards,compile,recompiles_verbose") == {
        "recompiles",
        "guards",
        "compile",
        "recompiles_verbose",
    }
    with pytest.raises(ValueError, match="unknown tripwire log 'graph'"):
        logs.parse_logs("recompiles,graph")
    with pytest.raises(TypeError):
        logs.parse_logs([3])


def test_set_logs_attaches_one_handler_and_removes_it():
    stream = io.StringIO()
    assert tw.set_logs("recompiles", stream=stream) == {"recompiles"}
    tw.set_logs("recompiles", stream=stream)  # idempotent: still one handler
    mine = [h for h in logs.RECOMPILES.handlers if getattr(h, logs._HANDLER_MARK, False)]
    assert len(mine) == 1
    assert logs.RECOMPILES.level == logging.INFO
    assert logs.recompile_logging_enabled()
    logs.report_recompile(sample_fn, failures_for({"x": 1, "cfg": {"mode": "slow"}}))
    out = stream.getvalue()
    assert out.startswith("[tripwire.recompiles] Recompiling function sample_fn")
    tw.set_logs("")
    assert not [h for h in logs.RECOMPILES.handlers if getattr(h, logs._HANDLER_MARK, False)]
    assert logs.RECOMPILES.level == logging.NOTSET


def test_set_logs_leaves_application_handlers_alone():
    other = logging.NullHandler()
    logs.RECOMPILES.addHandler(other)
    try:
        tw.set_logs("recompiles", stream=io.StringIO())
        tw.set_logs("")
        assert other in logs.RECOMPILES.handlers
    finally:
        logs.RECOMPILES.removeHandler(other)


_CHILD = """
import logging, tripwire as tw
from tripwire import logs
def f(x): return x
b = tw.GuardBuilder({"x": 1}); b.equals("L['x']"); gs = b.build()
print(logs.RECOMPILES.level == logging.INFO, flush=True)
logs.report_recompile(f, [gs.why_not({"x": 2})])
"""


def _child(env_value):
    env = dict(os.environ)
    env.pop("TRIPWIRE_LOGS", None)
    if env_value is not None:
        env["TRIPWIRE_LOGS"] = env_value
    return subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=120
    )


def test_env_var_enables_recompiles_on_stderr():
    r = _child("recompiles")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True"
    assert "[tripwire.recompiles] Recompiling function f in <string>:" in r.stderr
    assert "source: L['x']  kind: EQUALS_MATCH  expected: 1  actual: 2" in r.stderr


def test_env_var_absent_or_bad_logs_nothing():
    r = _child(None)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False" and "Recompiling" not in r.stderr
    r = _child("-recompiles")  # quiet: errors only
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False" and "Recompiling" not in r.stderr


def test_env_var_unknown_name_is_ignored_alone_with_one_warning():
    # guards is known now; bogus and +nope are not: one line names both, recompiles still applies.
    r = _child("bogus, recompiles,+nope")
    assert r.returncode == 0, r.stderr
    warn = [ln for ln in r.stderr.splitlines() if "TRIPWIRE_LOGS" in ln]
    assert len(warn) == 1, r.stderr
    assert "ignoring unknown tripwire logs 'bogus', '+nope'" in warn[0]
    assert r.stdout.strip() == "True"
    assert "[tripwire.recompiles] Recompiling function f in <string>:" in r.stderr


def test_env_var_guards_and_recompiles_both_apply():
    # The case: `guards` was unknown and made the whole value be ignored.
    env = dict(os.environ, TRIPWIRE_LOGS="guards,recompiles")
    child = "import tripwire as tw\n@tw.specialize\ndef f(x):\n    return x\nf(1); f('s')\n"
    r = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "TRIPWIRE_LOGS" not in r.stderr  # no warning: both names are known
    assert r.stderr.count("[tripwire.guards] GUARDS of f#") == 2, r.stderr
    assert "[tripwire.recompiles] Recompiling function f in <string>:2" in r.stderr


def _specialized_two_compiles(spec, stream):
    tw.set_logs(spec, stream=stream)

    @tw.specialize
    def scaled(x, n):
        return x * n

    scaled(2, 3)
    scaled("a", 4)  # the first entry fails on two guards: L['x']'s and L['n']'s value
    return scaled


def test_guards_log_prints_each_compiles_guard_set():
    out = io.StringIO()
    f = _specialized_two_compiles("guards", out)
    text = out.getvalue()
    assert text.count("[tripwire.guards] GUARDS of _specialized_two_compiles.<locals>.scaled#") == 2
    assert "GuardSet: 2 guards on 2 sources; 0 checks, 0 passed" in text  # not build()'s own check
    # the tree itself, not a summary: each entry's guards with their install sites
    assert "  EQUALS_MATCH: L['x'] == 2   # #0, installed at" in text
    assert "  EQUALS_MATCH: L['n'] == 4   # #1, installed at" in text
    assert len(f.cache) == 2
    assert "Recompiling" not in text and "Compiled function" not in text


def test_compile_log_says_what_how_long_and_how_many_guards():
    out = io.StringIO()
    f = _specialized_two_compiles("compile", out)
    lines = [ln for ln in out.getvalue().splitlines() if ln.startswith("[tripwire.compile]")]
    assert len(lines) == 2, out.getvalue()
    code = f.__wrapped__.__code__
    n = len(list(f.cache)[0].guards)
    assert lines[1].startswith(
        f"[tripwire.compile] Compiled function {code.co_qualname} in {code.co_filename}:{code.co_firstlineno} as "
    )
    assert f"ms: {n} guards on " in lines[1]
    assert float(lines[1].split(" in ")[2].split(" ms")[0]) >= 0


def test_recompiles_names_each_entrys_first_failure_verbose_names_every_failure():
    out = io.StringIO()
    _specialized_two_compiles("recompiles", out)
    plain = out.getvalue()
    assert plain.count("    - entry 0") == 1 and "failing guards" not in plain
    for spec in ("recompiles_verbose", "+recompiles", "recompiles,recompiles_verbose"):
        out = io.StringIO()
        _specialized_two_compiles(spec, out)
        verbose = out.getvalue()
        assert "- entry 0 '_specialized_two_compiles.<locals>.scaled#0': 2 failing guards" in verbose, (
            spec,
            verbose,
        )
        assert "source: L['x']  kind: EQUALS_MATCH" in verbose
        assert "source: L['n']  kind: EQUALS_MATCH" in verbose
    assert logs.RECOMPILES.level == logging.DEBUG


def test_minus_prefix_is_quiet_and_plus_is_debug():
    out = io.StringIO()
    assert tw.set_logs("-recompiles,+compile", stream=out) == {"recompiles", "compile"}
    assert logs.RECOMPILES.level == logging.ERROR and logs.COMPILES.level == logging.DEBUG
    assert not logs.recompile_logging_enabled()
    with pytest.raises(ValueError, match="unknown tripwire log '-bogus'"):
        tw.set_logs("recompiles,-bogus")
    assert logs.COMPILES.level == logging.DEBUG  # a rejected spec changes nothing


def test_format_recompile_names_a_decorated_function():
    @tw.specialize
    def decorated(x):
        return x

    code = decorated.__wrapped__.__code__
    msg = tw.format_recompile(decorated, [])
    assert msg.startswith(
        f"Recompiling function {code.co_qualname} in {code.co_filename}:{code.co_firstlineno}"
    )

    class Lying:
        def __getattr__(self, name):
            raise RuntimeError("no")

    class Loop:
        @property
        def __wrapped__(self):
            return self

    assert ".<locals>.Lying in <unknown>" in tw.format_recompile(Lying(), [])
    assert "in <unknown>" in tw.format_recompile(Loop(), [])


def test_frame_runtime_logs_its_compiles_and_guards():
    from tripwire import frame as twf

    def target(n):
        return n + 1

    def compile_frame(frame):
        if frame.code is not target.__code__:
            return twf.SKIP
        b = tw.GuardBuilder(frame.f_locals, f_globals=frame.f_globals)
        b.equals("L['n']")
        return frame.code, b.build()

    out = io.StringIO()
    tw.set_logs("compile,guards,recompiles", stream=out)
    try:
        with twf.hooked(compile_frame):
            target(1)
            target(2)
    finally:
        twf.reset(target)
    text = out.getvalue()
    assert text.count("[tripwire.compile] Compiled function ") == 2, text
    assert "as 'test_frame_runtime_logs_its_compiles_and_guards.<locals>.target#1'" in text
    assert text.count("[tripwire.guards] GUARDS of ") == 2
    assert "EQUALS_MATCH: L['n'] == 2" in text
    assert "[tripwire.recompiles] Recompiling function " in text


def test_verbose_error_on_recompile_keeps_one_failure_per_entry():
    tw.set_logs("recompiles_verbose", stream=io.StringIO())

    @tw.specialize(error_on_recompile=True)
    def g(x, n):
        return x

    g(2, 3)
    with pytest.raises(tw.RecompileError) as ei:
        g("a", 4)
    assert "2 failing guards" in str(ei.value)
    (only,) = ei.value.failures
    assert isinstance(only, tw.Failure) and only.source == "L['x']"


def test_an_entry_dropped_between_the_two_snapshots_does_not_break_the_report():
    # A collection inside why_not can drop an entry whose identity-held object died: the entry
    # list and the failures then differ in length, and the report goes without names.
    fails = failures_for({"x": 1, "cfg": {"mode": "slow"}})

    class Shrinking:
        def __iter__(self):
            return iter([])

        def why_not(self, f_locals):
            return fails

    stream = io.StringIO()
    tw.set_logs("recompiles_verbose", stream=stream)
    names, firsts = logs.report_recompile_of(sample_fn, Shrinking(), {})
    assert names == [None] and firsts == list(fails)
    assert "- entry 0: L['cfg']['mode']" in stream.getvalue()
