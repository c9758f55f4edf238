"""Install sites: the stack walk that reads CPython's frames without making frame objects, and its
own reading of the location table, against CPython's frame objects and PyCode_Addr2Line.

runtime/frame/install_site.cpp walks the thread's interpreter frames through the version's layout
mirror (checked once against the frame-object walk) and reads a site's line from the code's
location table itself. A wrong line or a skipped frame would not make a guard pass that should
fail, but every message naming an install site would lie: these compare both with CPython.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import sys
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tripwire as tw
from gc_stress import examples, scaled
from tripwire import _core, builder


def _code_objects(root: types.CodeType) -> list[types.CodeType]:
    found = [root]
    for c in root.co_consts:
        if isinstance(c, types.CodeType):
            found.extend(_code_objects(c))
    return found


def _module_codes(name: str) -> list[types.CodeType]:
    mod = importlib.import_module(name)
    path = getattr(mod, "__file__", None)
    if not path or not path.endswith(".py"):
        return []
    with open(path, encoding="utf-8") as f:
        return _code_objects(compile(f.read(), path, "exec"))


def _assert_lines_agree(code: types.CodeType) -> int:
    n = 0
    for offset in range(-2, len(code.co_code) + 6, 2):
        mine, cpython = _core.testing.instruction_lines(code, offset)
        assert mine == cpython, (code, offset)
        n += 1
    return n


@pytest.mark.parametrize(
    "module",
    ["tripwire.builder", "tripwire.guard_set", "tripwire.shapes", "asyncio.base_events", "typing",
     "dataclasses", "argparse", "email.message", "json.decoder", "inspect"],
)  # fmt: skip
def test_instruction_lines_agree_with_pycode_addr2line_on_every_instruction(module: str) -> None:
    """The site's line is read from the location table by install_site.cpp (only lines, no
    columns): the same as PyCode_Addr2Line on every instruction offset (and before the first, and
    past the last) of every code object of these modules."""
    codes = _module_codes(module)
    assert codes
    assert sum(_assert_lines_agree(c) for c in codes) > 100


_piece = st.sampled_from(
    [
        "x = 1",
        "x = (a +\n  b)",
        "y = [i for i in range(3)]",
        "z = f(a, b,\n      c)" + " " * 130 + "+ d",  # a column past 127: the long form
        "\n" * 70 + "w = 2",  # a line delta past one varint chunk
        "pass",
        "if a:\n    x = 1\nelse:\n    x = 2",
        "for i in range(2):\n    x += i",
        "try:\n    x = 1\nexcept Exception:\n    x = 2",
        "with c:\n    x = 3",
        "x = lambda q: (q,\n  q)",
        "def g():\n    yield 1\n    yield (2 +\n 3)",
        "while a:\n    break",
        "x = {k: v for k, v in d.items()}",
        "return_ = 1",
        "del x",
    ]
)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(_piece, min_size=1, max_size=12), st.integers(1, 5000))
def test_instruction_lines_agree_on_generated_code(pieces: list, first_line: int) -> None:
    """Generated functions (long jumps between lines, columns past 127, loops, handlers, nested
    code), starting at any first line: every instruction's line as CPython says."""
    body = "\n".join(pieces)
    src = "\n" * (first_line - 1) + "def f(a, b, c, d):\n" + "\n".join("    " + ln for ln in body.split("\n"))
    try:
        code = compile(src, "<generated>", "exec")
    except SyntaxError:
        return
    for c in _code_objects(code):
        _assert_lines_agree(c)


def test_instruction_lines_of_replaced_line_tables() -> None:
    """A code object whose line table was replaced (code.replace(co_linetable=...)), as tools that
    rewrite bytecode do: still CPython's answer (an entry this does not read as it expects would
    be left to CPython)."""

    def f(a: int) -> int:
        b = a + 1
        return b * 2

    code = f.__code__
    table = code.co_linetable
    for variant in (
        table,
        b"",
        table[: len(table) // 2],
        bytes([0xF8 | (len(code.co_code) // 2 - 1) % 8]) * 40,
    ):
        try:
            replaced = code.replace(co_linetable=variant)
        except (ValueError, TypeError):
            continue
        _assert_lines_agree(replaced)


def _expected_stack(depth: int, f: types.FrameType | None) -> tuple:
    """The stack from frame `f` out as the frame objects give it: each one's own line, the
    machinery left out, at most `depth` entries, innermost last."""
    out = []
    while f is not None and len(out) < depth:
        name = f.f_code.co_filename
        if not builder._is_machinery(name):
            out.append(f"{name}:{f.f_lineno} in {f.f_code.co_name}")
        f = f.f_back
    return tuple(reversed(out))


def _stack_from_caller(depth: int) -> tuple:
    """(user_stack reading the frames, user_stack walking frame objects, the frame objects' own
    stack), each from this helper's caller out (the memo emptied before each walk)."""
    _core._clear_install_site_memo()
    raw = _core.user_stack(builder._is_machinery, depth + 1)[:-1]  # without this helper's frame
    was = _core.testing.set_frame_object_walk(True)
    try:
        _core._clear_install_site_memo()
        objects = _core.user_stack(builder._is_machinery, depth + 1)[:-1]
    finally:
        _core.testing.set_frame_object_walk(was)
    return raw, objects, _expected_stack(depth, sys._getframe(1))


def _agree(depth: int = 40) -> tuple:
    raw, objects, want = _stack_from_caller(depth)
    assert raw == objects == want, (raw, objects, want)
    assert _core.testing.frame_walks_agree()
    return raw


def test_the_frames_read_agree_with_frame_objects_through_calls_generators_and_c() -> None:
    """Plain calls, a generator, a coroutine, a class body, a lambda, a comprehension, callbacks
    from C (sorted's key, map), recursion past the depth: the walk that reads the frames gives
    the frame-object walk's stack, with the frame objects' own lines."""
    seen: list[tuple] = []

    def plain() -> None:
        seen.append(_agree())

    def gen():  # type: ignore[no-untyped-def]
        seen.append(_agree())
        yield 1
        seen.append(_agree())

    async def coro() -> None:
        seen.append(_agree())

    def recurse(n: int) -> None:
        if n == 0:
            seen.append(_agree(depth=8))
            return
        recurse(n - 1)

    plain()
    g = gen()
    next(g)
    next(g, None)
    c = coro()
    with pytest.raises(StopIteration):
        c.send(None)
    asyncio.run(coro())
    sorted([3, 1, 2], key=lambda v: (plain(), v)[1])
    list(map(lambda v: plain(), range(2)))
    [plain() for _ in range(2)]

    class Body:
        plain()

    recurse(30)
    assert len(seen) >= 12
    assert all("test_install_site.py" in s[-1] for s in seen)
    assert len(seen[-1]) == 8  # the deep recursion: cut at the depth


def test_guard_sites_are_the_callers_lines_on_both_walks() -> None:
    """A guard's recorded stack names the line that declared it, on both walks."""
    b = tw.GuardBuilder({"n": 3})
    first = b.shape("L['n'] > 1")
    line = sys._getframe().f_lineno - 1
    was = _core.testing.set_frame_object_walk(True)
    try:
        _core._clear_install_site_memo()
        second = b.shape("L['n'] > 2")
    finally:
        _core.testing.set_frame_object_walk(was)
    want = f"{__file__}:{{}} in test_guard_sites_are_the_callers_lines_on_both_walks"
    assert first.stack[-1] == want.format(line)
    assert second.stack[-1] == want.format(line + 5)
    assert first.stack[:-1] == second.stack[:-1]


class _Finalizer:
    """A garbage cycle whose finalizer compares the two walks wherever a collection runs it (in a
    frame's prologue too, where the frame is incomplete and both walks pass over it)."""

    results: list = []

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        _Finalizer.results.append(_core.testing.frame_walks_agree())
        _Finalizer.results.append(len(_core.user_stack(builder._is_machinery, 8)) > 0)


def test_the_walks_agree_inside_finalizers_run_by_collections_anywhere() -> None:
    """Collections at every allocation (threshold 1) run finalizers inside frames' prologues
    (MAKE_CELL allocates a cell before the frame is complete), generators and comprehensions:
    the walk that reads the frames agrees with the frame-object walk in each."""
    _Finalizer.results = []

    def with_cells(a: int):  # type: ignore[no-untyped-def]
        def inner() -> int:
            return a + 1

        return inner

    def gen(n: int):  # type: ignore[no-untyped-def]
        for i in range(n):
            _Finalizer()
            yield with_cells(i)()

    old = gc.get_threshold()
    gc.set_threshold(1)
    try:
        for i in range(scaled(300, 10)):
            _Finalizer()
            with_cells(i)()
            sum(gen(3))
            [_Finalizer() for _ in range(2)]
    finally:
        gc.set_threshold(*old)
    gc.collect()
    assert _Finalizer.results and all(_Finalizer.results)


def test_the_install_site_memo_keeps_sites_right_when_code_objects_die() -> None:
    """Sites are memoised by (code object, instruction), the code held by the memo: code objects
    made, used and dropped one after another (addresses reused) still give their own lines."""
    for i in range(scaled(200, 10)):
        ns: dict = {}
        src = "\n" * i + "def f(walk):\n    return walk()\n"
        exec(compile(src, f"/tmp/tw_site_{i % 3}.py", "exec"), ns)
        stack = ns["f"](lambda: _core.user_stack(builder._is_machinery, 2))
        assert stack[-2] == f"/tmp/tw_site_{i % 3}.py:{i + 2} in f", (i, stack)
        del ns
        if i % 50 == 0:
            _core._clear_install_site_memo()
