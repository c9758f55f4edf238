"""tripwire.frame: Dynamo's PEP 523 frame runtime on the tripwire engine.

A JIT written in Python gets a callback for every Python frame about to run; it may hand back a
replacement code object and the guards under which that replacement is valid. tripwire caches
the pair on the code object and, on every later call, checks the guards in C++ on the frame's
fast locals (no dict is built) and runs the replacement in the same frame::

    import tripwire as tw
    from tripwire import frame as twf

    def compile_frame(frame):
        if frame.code is not f.__code__:
            return twf.SKIP                          # never look at this code again
        b = tw.GuardBuilder(frame.f_locals, f_globals=frame.f_globals)
        b.equals("L['n']")
        return make_replacement(frame.code, frame.f_locals["n"]), b.build()

    with twf.hooked(compile_frame):
        f(x, 3)      # miss: compile_frame runs, the replacement runs
        f(y, 3)      # hit: guards checked in C++, the replacement runs
        f(y, 4)      # recompile: L['n'] failed

The callback's contract (docs/frame.md): ``callback(frame)`` gets a :class:`Frame` (``code``,
``f_locals`` as a read-only mapping, ``f_globals``, ``f_builtins``, ``function``, ``cache``) and
returns one of

* ``(code, guard_set)``: cache it and run ``code`` in this frame. ``code`` must be compatible
  with the frame's layout (same argument slots and free variables; checked once, an
  :class:`tripwire.IncompatibleCodeError` otherwise). Free variables are ``L['name']`` sources
  (the frame's own closure); ``G[...]`` sources must be built against ``frame.f_globals``.
* :data:`SKIP`: never intercept this code again (for this backend).
* :data:`RUN_ONLY`: keep using the cache, but never call back for this code again.
* ``None``: run the original code this time.

Frames run inside the callback are not intercepted. Generators, coroutines, module and class
bodies and generator unwinding are never intercepted. If the callback raises, the frame runs its
original code and the error is logged on ``tripwire.frame`` (``raise_errors=True`` re-raises it
from the call instead). When the cache refuses an entry for a limit, the code switches to
RUN_ONLY (``on_limit="run_only"``, the default) or follows the cache's policy
(``"raise"``: :class:`tripwire.RecompileLimitExceeded` from the call; ``"fallback"``: run the
original and call back next time; ``"evict"``: drop the least recently used entry).

Hooks are per thread (installed interpreter-wide, enabled per thread), and nest: :func:`hooked`
restores the thread's previous hook. Caches live on the code object, one per backend (by default
the callback itself), and die with it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import sys
import time
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

import tripwire._core as _core

from ._package import is_own_file
from .cache import Cache, OnLimit, recording_recompiles
from .errors import FrameError, IncompatibleCodeError, RecompileLimitExceeded
from .failure import Failure
from .guard_set import GuardSet
from .logs import RECOMPILES, report_compile, report_recompile_of

__all__ = [
    "RUN_ONLY",
    "SKIP",
    "SKIP_RECURSIVE",
    "Frame",
    "FrameOnLimit",
    "Hook",
    "Replacement",
    "cache_of",
    "current",
    "hooked",
    "install",
    "reset",
    "scoped",
    "status",
    "strategy_of",
    "suspended",
    "uninstall",
]

LOG = logging.getLogger("tripwire.frame")

# The C type (runtime/frame/replacement.hpp): made only through the layout check.
Replacement: Any = _core.Replacement
# The per-call scope (runtime/frame/hook.hpp): made by scoped() and suspended().
_FrameScope: Any = _core.FrameScope
_core._frame_setup(FrameError)

_STRATEGY_NAMES = {0: "default", 1: "skip", 2: "run_only", 3: "skip_recursive"}
FrameOnLimit = Literal["run_only", "raise", "fallback", "evict"]
"""What a code object's cache does at a limit (see :class:`Hook`)."""
_ON_LIMIT: tuple[str, ...] = typing.get_args(FrameOnLimit)


class _Marker:
    __slots__ = ("_code", "_name")

    def __init__(self, name: str, code: int) -> None:
        self._name = name
        self._code = code

    def __repr__(self) -> str:
        return f"tripwire.frame.{self._name}"

    def __reduce__(self) -> str:
        return self._name


SKIP: Any = _Marker("SKIP", 1)
"""Returned by a callback: never intercept this code object again (for this backend)."""
RUN_ONLY: Any = _Marker("RUN_ONLY", 2)
"""Returned by a callback: use the cached entries of this code object, never call back for it."""
SKIP_RECURSIVE: Any = _Marker("SKIP_RECURSIVE", 3)
"""Returned by a callback: never intercept this code object again, and run its frames with this
thread's hook suspended for their whole dynamic extent (nothing they call is intercepted either:
Dynamo's recursive skip, what ``torch.compiler.disable`` and a compiled graph's frames need)."""


class Frame:
    """A frame about to run, as a callback sees it. A snapshot: it holds no pointer into the
    interpreter's frame, so keeping it after the callback returns is safe.

    Attributes:
        code: the frame's code object.
        f_locals: its arguments by name (a read-only mapping; free variables unboxed from the
            function's closure; other locals are not set yet).
        f_globals, f_builtins: the frame's globals and builtins dicts.
        function: the function being called.
        cache: the :class:`tripwire.Cache` of this code object for the hook's backend.
        backend: the hook's backend key.
    """

    __slots__ = ("backend", "cache", "code", "f_builtins", "f_globals", "f_locals", "function")

    def __init__(
        self,
        code: types.CodeType,
        f_locals: Mapping[str, Any],
        f_globals: dict[str, Any],
        f_builtins: dict[str, Any],
        function: types.FunctionType,
        cache: Cache,
        backend: Any,
    ) -> None:
        self.code = code
        self.f_locals = f_locals
        self.f_globals = f_globals
        self.f_builtins = f_builtins
        self.function = function
        self.cache = cache
        self.backend = backend

    def why_not(self) -> list[Failure | None]:
        """Why each cached entry does not match this frame (most recently used first)."""
        return self.cache.why_not(self.f_locals)

    def limit_reached(self) -> str | None:
        """``"recompile_limit"`` or ``"accumulated_limit"`` when inserting an entry compiled for
        this frame would reach that limit of its cache, else None; asked before compiling, so
        that a compile whose insert would be refused is not wasted. recompile_limit counts the
        entries whose ID_MATCH guards on ``L[...]`` sources all pass on this frame (Dynamo's rule:
        the entries for the same identity-matched objects); a cache that evicts at its limits
        never refuses."""
        if self.cache.on_limit == "evict":
            return None
        return {0: None, 1: "recompile_limit", 2: "accumulated_limit"}[
            _core._frame_limit_reached(self.cache, dict(self.f_locals))
        ]

    def __repr__(self) -> str:
        c = self.code
        return f"<tripwire.frame.Frame {c.co_qualname} ({c.co_filename}:{c.co_firstlineno})>"


class Hook:
    """One installed callback with its options; the frame runtime calls it on every miss.

    Args:
        callback: ``callback(frame: Frame)`` (see the module docstring for what it returns).
        backend: the cache key (one :class:`tripwire.Cache` per code object and backend);
            default: the callback itself.
        recompile_limit, accumulated_limit: the limits of each code object's cache.
        on_limit: ``"run_only"`` (default: the code switches to RUN_ONLY), ``"raise"``,
            ``"fallback"`` or ``"evict"`` (the cache's own policies).
        raise_errors: re-raise a callback's exception from the intercepted call instead of
            logging it and running the original code.
    """

    def __init__(
        self,
        callback: Callable[[Frame], Any],
        *,
        backend: Any = None,
        recompile_limit: int = 8,
        accumulated_limit: int = 256,
        on_limit: FrameOnLimit = "run_only",
        raise_errors: bool = False,
    ) -> None:
        if not callable(callback):
            raise TypeError(f"a frame callback must be callable, not {type(callback).__name__}")
        if on_limit not in _ON_LIMIT:
            raise ValueError(f"on_limit must be one of {', '.join(map(repr, _ON_LIMIT))}, not {on_limit!r}")
        if recompile_limit < 1 or accumulated_limit < 1:
            raise ValueError("recompile_limit and accumulated_limit must be at least 1")
        self.callback = callback
        self.backend = callback if backend is None else backend
        self.recompile_limit = recompile_limit
        self.accumulated_limit = accumulated_limit
        self.on_limit = on_limit
        self.raise_errors = bool(raise_errors)

    def __repr__(self) -> str:
        name = getattr(self.callback, "__qualname__", None) or repr(self.callback)
        return f"<tripwire.frame.Hook {name} on_limit={self.on_limit!r}>"

    # The frame runtime's handler: called by the eval-frame function on a miss, with frames
    # intercepted on this thread suspended. Returns None (run the original), 1 (SKIP), 2
    # (RUN_ONLY) or a Replacement (run it); an exception propagates from the intercepted call.
    def __call__(
        self,
        code: types.CodeType,
        f_locals: dict[str, Any],
        f_globals: dict[str, Any],
        f_builtins: dict[str, Any],
        function: types.FunctionType,
    ) -> Any:
        if is_own_file(code.co_filename):
            return 1  # tripwire's own machinery (this module, the cache, the builder): skip
        cache: Any = _core._frame_cache(code, self.backend)
        if not isinstance(cache, Cache):  # none yet (or a bare CacheCore attached by hand)
            on_limit: OnLimit = "fallback" if self.on_limit == "run_only" else self.on_limit
            cache = Cache(self.recompile_limit, self.accumulated_limit, on_limit=on_limit)
            where = f"{code.co_filename}:{code.co_firstlineno}"
            cache._owner = ("frame", code.co_qualname, where, _backend_name(self.backend))
            _core._frame_attach_cache(code, self.backend, cache)
        frame = Frame(
            code, types.MappingProxyType(f_locals), f_globals, f_builtins, function, cache, self.backend
        )
        try:
            # Why each entry missed, before the callback runs and only when asked for: logged,
            # or kept with the compile (record_recompiles(): summary(), report()). Inside the
            # try: diagnostics that raise must not fail the intercepted call.
            names: list[str | None] = []
            failures: list[Failure | None] | None = None if len(cache) else []  # []: a first compile
            if failures is None:
                got = report_recompile_of(function, cache, f_locals, record=recording_recompiles())
                if got is not None:
                    names, failures = got
            start = time.perf_counter()
            result = self.callback(frame)
            return self._apply(frame, result, (time.perf_counter() - start, names, failures))
        except RecompileLimitExceeded:
            raise  # on_limit="raise": the user asked for the call to fail
        except Exception:
            if self.raise_errors:
                raise
            LOG.error(
                "tripwire.frame: the callback %r failed on %s; running the original code",
                self.callback,
                _where(code),
                exc_info=True,
            )
            return None

    def _apply(
        self, frame: Frame, result: Any, compile: tuple[float, list[str | None], list[Failure | None] | None]
    ) -> Any:
        if result is None:
            return None
        if isinstance(result, _Marker):
            return result._code
        if not (isinstance(result, tuple) and len(result) == 2):
            raise TypeError(
                f"a frame callback must return (code, guard_set), SKIP, RUN_ONLY or None, not {result!r}"
            )
        code, guards = result
        if not isinstance(code, types.CodeType):
            raise TypeError(
                f"a frame callback's replacement must be a code object, not {type(code).__name__}"
            )
        if not isinstance(guards, GuardSet):
            raise TypeError(
                f"a frame callback's guards must be a tripwire.GuardSet, not {type(guards).__name__}"
            )
        reads_globals, reads_closure = guards._root_kinds
        if reads_closure:
            raise ValueError(
                "guards for a frame cannot use C[...] sources: a frame's free variables are L['name'] "
                "(read from the frame's own closure)"
            )
        if reads_globals and guards._globals is not frame.f_globals:
            raise ValueError("guards with G[...] sources must be built against frame.f_globals")
        why = _core._frame_incompatibility(frame.code, code)
        if why is not None:
            raise IncompatibleCodeError(
                f"{code.co_qualname} cannot run in frames of {_where(frame.code)}: {why}"
            )
        replacement = Replacement(frame.code, code)
        cache = frame.cache
        n = getattr(cache, "_frame_compiles", 0)
        inserted = cache.insert(
            guards, replacement, name=f"{frame.code.co_qualname}#{n}", f_locals=frame.f_locals
        )
        if not inserted:  # a limit, under "run_only" or "fallback"
            if self.on_limit == "run_only":
                RECOMPILES.warning(
                    "tripwire.frame: %s reached a cache limit (recompile_limit=%d, accumulated_limit=%d); "
                    "running its cached entries only from now on (RUN_ONLY)",
                    _where(frame.code),
                    cache.recompile_limit,
                    cache.accumulated_limit,
                )
                return RUN_ONLY._code
            return None
        cache._frame_compiles = n + 1  # type: ignore[attr-defined]
        cache._record_compile(f"{frame.code.co_qualname}#{n}", *compile)
        report_compile(frame.function, f"{frame.code.co_qualname}#{n}", guards, compile[0])
        return replacement


def _backend_name(backend: Any) -> str:
    """A label for summary() and report(). The backend is any object: its __qualname__ or
    __repr__ may raise, and a label must not fail the intercepted call."""
    try:
        name = getattr(backend, "__qualname__", None)
        return name if isinstance(name, str) else repr(backend)
    except Exception:  # noqa: BLE001 - a lying backend gets its type's name
        return type(backend).__qualname__


def _where(code: types.CodeType) -> str:
    return f"{code.co_qualname} ({code.co_filename}:{code.co_firstlineno})"


def _code_of(obj: Any) -> types.CodeType:
    if isinstance(obj, types.CodeType):
        return obj
    code = getattr(obj, "__code__", None)
    if not isinstance(code, types.CodeType):
        raise TypeError(f"expected a function or a code object, not {type(obj).__name__}")
    return code


def _hook_of(callback: Callable[[Frame], Any] | Hook, options: dict[str, Any]) -> Hook:
    if isinstance(callback, Hook):
        if options:
            raise TypeError("options are Hook(...)'s: pass them there, not with a Hook")
        return callback
    return Hook(callback, **options)


def install(callback: Callable[[Frame], Any] | Hook, **options: Any) -> Hook:
    """Set this thread's frame hook (replacing any), installing the eval-frame function
    interpreter-wide if needed. ``options`` are :class:`Hook`'s. Returns the hook. Raises
    :class:`tripwire.FrameError` when another PEP 523 hook is installed or the interpreter is not
    supported."""
    hook = _hook_of(callback, options)
    _core._frame_set_hook(hook, hook.backend)
    return hook


def scoped(
    fn: Callable[..., Any],
    hook: Hook,
    *,
    fallback: Callable[..., Any] | None = None,
    enter: Callable[[], Any] | None = None,
    on_error: Callable[[Any], Any] | None = None,
    dispatch_keys: bool = False,
    divert: Sequence[tuple[Any, str, Any]] = (),
) -> Any:
    """A callable whose every call runs ``fn`` with ``hook`` as this thread's frame hook and then
    restores the thread's previous hook (or none), even on an exception: the hook's scope is one
    call, as torch.compile's wrapper sets Dynamo's callback. It is a C object (``_core.FrameScope``):
    a call costs no Python frame. A call made while the same hook is already set (recursion, a
    compiled function calling a sibling) runs as is; a call made inside a suspended extent sets
    the hook for its own extent.

    Args:
        fallback: called with the same arguments instead of ``fn`` when the hook cannot be set
            because another PEP 523 eval-frame function is installed (FrameError); without it
            that call raises.
        divert: ``(obj, "name.name", value)`` tests, read at the start of every call, in C (no
            Python frame): when the attribute path read from ``obj`` equals ``value`` for any of
            them, the call goes to ``fallback`` (or to ``fn`` unhooked). Each read goes through
            ``obj`` afresh, so a module global that is rebound (torch's stance) is seen.
        enter: called with no argument before ``fn`` (after ``divert``); NotImplemented sends the
            call to ``fallback`` as ``divert`` does, any other result is passed to ``on_error``.
            A C function (a builtin) costs no Python frame.
        on_error: called with ``enter``'s result (or None) when ``fn`` raises, before the hook is
            restored; its own exception is reported as unraisable, the call's propagates.
        dispatch_keys: put torch's thread-local dispatch key sets back after every call of
            ``fn`` (after ``on_error``), as torch.compile's wrapper does with
            ``_ForceDispatchKeyGuard``; saved and restored in C by the torch adapter (ValueError
            when it is not installed).
    """
    if not isinstance(hook, Hook):
        raise TypeError(f"scoped() needs a tripwire.frame.Hook, not {type(hook).__name__}")
    tests = []
    for obj, path, value in divert:
        names = tuple(sys.intern(n) for n in str(path).split("."))
        if not all(n.isidentifier() for n in names):
            raise ValueError(f"scoped(): divert path {path!r} is not a dotted attribute path")
        tests.append((obj, names, value))
    return _FrameScope(fn, hook, hook.backend, fallback, enter, on_error, dispatch_keys, tuple(tests) or None)


def suspended(fn: Callable[..., Any]) -> Any:
    """A callable whose every call runs ``fn`` with this thread's frame hook suspended for the
    call's whole dynamic extent (nothing it calls is intercepted), then resumes it: the per-call
    form of :data:`SKIP_RECURSIVE`. A C object (``_core.FrameScope``)."""
    return _FrameScope(fn, None, None)


def uninstall() -> None:
    """Clear this thread's frame hook. When no thread has one any more, the interpreter's previous
    eval-frame function is restored. Frames already running continue as they are."""
    _core._frame_set_hook(None, None)


def current() -> Hook | None:
    """This thread's hook, or None."""
    h = _core._frame_get_hook()
    return None if h is None else h[0]


@contextlib.contextmanager
def hooked(callback: Callable[[Frame], Any] | Hook, **options: Any) -> Iterator[Hook]:
    """Run the block with ``callback`` as this thread's frame hook; restore the previous hook
    (or none) afterwards, even on an exception."""
    hook = _hook_of(callback, options)
    previous = _core._frame_set_hook(hook, hook.backend)
    try:
        yield hook
    finally:
        if previous is None:
            _core._frame_set_hook(None, None)
        else:
            _core._frame_set_hook(*previous)


def cache_of(fn: Any, backend: Any) -> Cache | None:
    """The :class:`tripwire.Cache` of a function's (or code object's) frames for ``backend`` (the
    callback, unless the hook named another backend), or None."""
    cache = _core._frame_cache(_code_of(fn), backend)
    return cache if isinstance(cache, Cache) else None


def strategy_of(fn: Any, backend: Any) -> str:
    """``"default"``, ``"skip"``, ``"run_only"`` or ``"skip_recursive"``: what the frame runtime does with the code for
    ``backend``."""
    return _STRATEGY_NAMES[_core._frame_strategy(_code_of(fn), backend)]


def reset(fn: Any, backend: Any = None) -> None:
    """Forget what the frame runtime learnt about a function (or code object): its caches are
    cleared and its strategies set back to default, for ``backend`` or for every backend."""
    _core._frame_reset(_code_of(fn), backend)


def status() -> dict[str, Any]:
    """The runtime's state: ``installed`` (the eval-frame function is tripwire's), ``active_threads``,
    ``layout_verified``/``layout_error`` (the interpreter-frame layout check), ``eval_frame``
    (``"default"``, ``"tripwire"`` or ``"foreign"``), and ``in_place``/``shadow``: replacements run
    so far by retargeting the frame and in shadow frames."""
    s = _core._frame_status()
    s["in_place"], s["shadow"] = _core._frame_run_stats()
    return s


@atexit.register
def _uninstall_at_exit() -> None:
    # The main thread's hook goes before the interpreter tears modules down (the handler lives in
    # this module); other threads' hooks die with their thread states.
    with contextlib.suppress(Exception):
        _core._frame_set_hook(None, None)
    # Module-level code objects often outlive the interpreter's teardown: drop their caches now,
    # while the objects those hold (guard sets, payloads, globals) can still be freed normally.
    with contextlib.suppress(Exception):
        _core._frame_release_all()
