"""Install sites: the stack walk behind every guard's recorded stack, against the frame objects'
own stack.

runtime/frame/install_site.cpp walks CPython's frame objects (PyEval_GetFrame, PyFrame_GetBack),
leaves out tripwire's own frames and memoises each (code, instruction) frame's site. A wrong line
or a skipped frame would not make a guard pass that should fail, but every message naming an
install site would lie: these compare the walk with the frames Python code sees.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import types

import pytest

import tripwire as tw
from gc_stress import scaled
from tripwire import _core, builder


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


def _agree(depth: int = 40) -> tuple:
    """user_stack from this helper's caller out, memo emptied and then memoised: both the frame
    objects' own stack."""
    want = _expected_stack(depth, sys._getframe(1))
    _core._clear_install_site_memo()
    fresh = _core.user_stack(builder._is_machinery, depth + 1)[:-1]  # without this helper's frame
    memoised = _core.user_stack(builder._is_machinery, depth + 1)[:-1]
    assert fresh == memoised == want, (fresh, memoised, want)
    return fresh


def test_the_walk_agrees_with_frame_objects_through_calls_generators_and_c() -> None:
    """Plain calls, a generator, a coroutine, a class body, a lambda, a comprehension, callbacks
    from C (sorted's key, map), recursion past the depth: the walk gives the frame objects' stack,
    with their own lines, fresh and from the memo."""
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


def test_guard_sites_are_the_callers_lines() -> None:
    """A guard's recorded stack names the line that declared it, through GuardBuilder.shape's C++
    call and through the Python declarations, fresh and memoised."""
    b = tw.GuardBuilder({"n": 3})
    first = b.shape("L['n'] > 1")
    line = sys._getframe().f_lineno - 1
    _core._clear_install_site_memo()
    second = b.shape("L['n'] > 2")
    third = b.type_match("L['n']")
    want = f"{__file__}:{{}} in test_guard_sites_are_the_callers_lines"
    assert first.stack[-1] == want.format(line)
    assert second.stack[-1] == want.format(line + 3)
    assert third.stack[-1] == want.format(line + 4)
    assert first.stack[:-1] == second.stack[:-1] == third.stack[:-1]


class _Finalizer:
    """A garbage cycle whose finalizer walks the stack wherever a collection runs it (in a frame's
    prologue too, where the frame is incomplete and the walk passes over it), and compares it with
    the frame objects' own stack."""

    results: list = []

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        # One line: the frame's own line is this one during both walks.
        stack, want = _core.user_stack(builder._is_machinery, 8), _expected_stack(8, sys._getframe())
        _Finalizer.results.append(len(stack) > 0 and stack == want)


def test_the_walk_agrees_inside_finalizers_run_by_collections_anywhere() -> None:
    """Collections at every allocation (threshold 1) run finalizers inside frames' prologues
    (MAKE_CELL allocates a cell before the frame is complete), generators and comprehensions:
    the walk is the frame objects' stack in each, and the memo it fills meanwhile stays right."""
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


def test_a_machinery_test_that_raises_or_lies_or_re_enters() -> None:
    """is_machinery is Python code: its exception comes out of the walk (nothing memoised, no
    error left set); an answer whose truth raises does the same; one that walks the stack again
    and empties the memo meanwhile leaves the outer walk's sites right."""

    class Boom(Exception):
        pass

    def raises(name: str) -> bool:
        raise Boom(name)

    class Lying:
        def __bool__(self) -> bool:
            raise Boom("truth")

    _core._clear_install_site_memo()
    with pytest.raises(Boom):
        _core.user_stack(raises, 8)
    with pytest.raises(Boom):
        _core.user_stack(lambda name: Lying(), 8)
    nested: list[tuple] = []

    def re_enters(name: str) -> bool:
        if len(nested) < 3:
            nested.append(_core.user_stack(builder._is_machinery, 8))
            _core._clear_install_site_memo()
        return builder._is_machinery(name)

    want = _expected_stack(8, sys._getframe())
    _core._clear_install_site_memo()
    got = _core.user_stack(re_enters, 8)  # the same line as `want`'s frame
    assert got[:-1] == want[:-1] and got[-1].rsplit(":", 1)[0] == want[-1].rsplit(":", 1)[0]
    assert len(nested) == 3 and all(len(s) > 0 for s in nested)
    assert _core.user_stack(builder._is_machinery, 8)[:-1] == want[:-1]
