"""tripwire's logs: recompile reasons, the guards of each compile, and compiles, as ``TORCH_LOGS``.

* ``recompiles`` (``logging.getLogger("tripwire.recompiles")``): when a specialised function misses
  a cache that already holds entries, why each entry did not pass, at INFO, as
  ``TORCH_LOGS=recompiles`` does for Dynamo: the function and its file:line, and per cached entry
  the first failing guard's source, kind, expected and actual values, and the user stack that
  installed it (innermost frame last). ``recompiles_verbose`` (or ``+recompiles``) lists every
  failing guard of every entry, as torch's ``recompiles_verbose``.
* ``guards`` (``tripwire.guards``): the guard set of each compile, as ``explain()`` prints it, as
  torch's ``guards`` log prints the guard tree of each compile.
* ``compile`` (``tripwire.compile``): one line per compile: what was compiled (function, file:line,
  entry name), how long compiling and building its guards took, how many guards.

Enable them from the environment (read once, when tripwire is imported)::

    TRIPWIRE_LOGS=recompiles,guards python my_program.py

or from code with ``tw.set_logs("recompiles,guards")`` (``tw.set_logs("")`` turns them off again).
The syntax is ``TORCH_LOGS``': comma-separated names; ``+name`` is verbose (level DEBUG),
``-name`` quiet (level ERROR: only errors). An unknown name in ``TRIPWIRE_LOGS`` is left out with
one warning naming it and the rest apply; ``set_logs`` raises ValueError for it. Each enabled log
gets one stderr handler; the logger still propagates, so the application's own logging
configuration (and pytest's ``caplog``) sees the records too. Configuring the loggers directly
with :mod:`logging` works as well: tripwire formats a message only when its logger is enabled for
INFO, so a disabled log costs nothing.
"""

from __future__ import annotations

import logging
import os
import sys
import types
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .catalogue import short_repr
from .errors import RecompileError
from .failure import Failure

__all__ = [
    "COMPILES",
    "GUARDS",
    "LOG_NAMES",
    "RECOMPILES",
    "format_recompile",
    "parse_logs",
    "recompile_logging_enabled",
    "report_compile",
    "report_recompile",
    "report_recompile_of",
    "set_logs",
]

RECOMPILES = logging.getLogger("tripwire.recompiles")
GUARDS = logging.getLogger("tripwire.guards")
COMPILES = logging.getLogger("tripwire.compile")

# Names accepted in TRIPWIRE_LOGS / set_logs: (logger, level). recompiles_verbose is recompiles
# at DEBUG (the level report_recompile_of reads to list every failing guard).
LOG_NAMES: dict[str, tuple[logging.Logger, int]] = {
    "recompiles": (RECOMPILES, logging.INFO),
    "recompiles_verbose": (RECOMPILES, logging.DEBUG),
    "guards": (GUARDS, logging.INFO),
    "compile": (COMPILES, logging.INFO),
}

_HANDLER_MARK = "_tripwire_logs_handler"


def _parse(spec: str | Iterable[str] | None) -> tuple[dict[str, int], list[str]]:
    """(name -> level, unknown names) for ``spec``."""
    if spec is None:
        return {}, []
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    levels: dict[str, int] = {}
    unknown: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"log names must be str, got {item!r}")
        name = item.strip().lower()
        sign = name[:1] if name[:1] in "+-" else ""
        name = name[len(sign) :].strip()
        if not name:
            continue
        if name not in LOG_NAMES:
            unknown.append(sign + name)
            continue
        level = LOG_NAMES[name][1]
        level = {"+": logging.DEBUG, "-": logging.ERROR}.get(sign, level)
        levels[name] = min(level, levels.get(name, level))
    return levels, unknown


def _unknown_message(unknown: list[str]) -> str:
    return f"unknown tripwire log{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; known: {', '.join(LOG_NAMES)}"


def parse_logs(spec: str | Iterable[str] | None) -> frozenset[str]:
    """The log names in ``spec``: a comma-separated string (``"recompiles,+guards"``, as in
    ``TRIPWIRE_LOGS``) or an iterable of names, without their ``+``/``-`` prefix. Whitespace and
    case are ignored, empty items are skipped; an unknown name raises ValueError listing the
    known ones."""
    levels, unknown = _parse(spec)
    if unknown:
        raise ValueError(_unknown_message(unknown))
    return frozenset(levels)


def _apply(levels: dict[str, int], stream: Any) -> None:
    # One logger may be named twice (recompiles, recompiles_verbose): the lowest level wins.
    per_logger: dict[logging.Logger, int] = {}
    for name, level in levels.items():
        logger = LOG_NAMES[name][0]
        per_logger[logger] = min(level, per_logger.get(logger, level))
    for logger in dict.fromkeys(lg for lg, _ in LOG_NAMES.values()):
        for h in list(logger.handlers):
            if getattr(h, _HANDLER_MARK, False):
                logger.removeHandler(h)
        if logger in per_logger:
            handler = logging.StreamHandler(sys.stderr if stream is None else stream)
            handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
            setattr(handler, _HANDLER_MARK, True)
            logger.addHandler(handler)
            logger.setLevel(per_logger[logger])
        else:
            logger.setLevel(logging.NOTSET)


def set_logs(spec: str | Iterable[str] | None = "", *, stream: Any = None) -> frozenset[str]:
    """Enable exactly the logs named in ``spec`` (see :func:`parse_logs`) and disable the others.

    An enabled log gets one handler writing to ``stream`` (default: ``sys.stderr`` at the time of
    the call) and its level (INFO; DEBUG for ``+name`` and ``recompiles_verbose``; ERROR for
    ``-name``); a disabled one loses that handler and goes back to level NOTSET (inheriting from
    its parents). Handlers added by the application are left alone. Returns the enabled names.
    """
    levels, unknown = _parse(spec)
    if unknown:
        raise ValueError(_unknown_message(unknown))
    _apply(levels, stream)
    return frozenset(levels)


def _configure_from_env() -> None:
    spec = os.environ.get("TRIPWIRE_LOGS")
    if not spec:
        return
    try:
        levels, unknown = _parse(spec)
    except TypeError as e:  # importing tripwire must not fail on a typo
        sys.stderr.write(f"tripwire: ignoring TRIPWIRE_LOGS={spec!r}: {e}\n")
        return
    if unknown:  # one line on stderr, at import: the rest still apply
        sys.stderr.write(f"tripwire: TRIPWIRE_LOGS={spec!r}: ignoring {_unknown_message(unknown)}\n")
    _apply(levels, None)


def recompile_logging_enabled() -> bool:
    """Whether a recompile reason would be logged (the logger is enabled for INFO)."""
    return RECOMPILES.isEnabledFor(logging.INFO)


def _where(fn: Callable) -> tuple[str, str]:
    """(qualified name, file:line) of ``fn``, through decorators: a wrapper without a code object
    (``@tw.specialize``, a C-level wrapper, ``functools.wraps``) is followed down ``__wrapped__``
    to the function it wraps. Reading attributes of user objects may raise or loop: bounded, and
    any error ends the search with what was found."""
    obj: Any = fn
    for _ in range(100):
        try:
            code = getattr(obj, "__code__", None)
            if isinstance(code, types.CodeType):
                return code.co_qualname, f"{code.co_filename}:{code.co_firstlineno}"
            obj = getattr(obj, "__wrapped__", None)
        except Exception:  # noqa: BLE001 - a lying __getattr__: no location
            break
        if obj is None:
            break
    try:
        name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    except Exception:  # noqa: BLE001
        name = None
    return (name if isinstance(name, str) else type(fn).__qualname__), "<unknown>"


def format_recompile(
    fn: Callable,
    failures: Sequence[Failure | Sequence[Failure] | None],
    names: Sequence[str | None] | None = None,
) -> str:
    """The recompile reason for ``fn`` given one :class:`Failure` per cached entry (most recently
    used first, as ``Cache.why_not`` returns them), or a list of them (every failing guard, for
    ``recompiles_verbose``); ``names`` optionally names the entries.

    Example::

        Recompiling function scale in /app/model.py:12
            triggered by the following guard failure(s):
            - entry 0 'scale#0': L['n']: EQUALS_MATCH expected 3, got 4 (...)
                source: L['n']  kind: EQUALS_MATCH  expected: 3  actual: 4
                guard installed at (innermost last):
                  /app/model.py:40 in main
    """
    qualname, where = _where(fn)
    lines = [
        f"Recompiling function {qualname} in {where}",
        "    triggered by the following guard failure(s):",
    ]
    if not failures:
        lines.append("    - (no cached entry)")
    for i, item in enumerate(failures):
        label = f"entry {i}"
        if names is not None and i < len(names) and names[i] is not None:
            label += f" {names[i]!r}"
        if item is None:
            lines.append(f"    - {label}: passes (another entry was preferred)")
            continue
        every = [item] if isinstance(item, Failure) else list(item)
        if len(every) > 1:
            lines.append(f"    - {label}: {len(every)} failing guards")
        for f in every:
            lines.append(f"    - {label}: {f.reason}")
            lines.append(
                f"        source: {f.source if f.source is not None else 'global state'}  kind: {f.kind}"
                f"  expected: {short_repr(f.expected, 120)}  actual: {short_repr(f.actual, 120)}"
            )
            stack = getattr(f.guard, "stack", ()) or ()  # the builder keeps only the user's frames
            if stack:
                lines.append("        guard installed at (innermost last):")
                lines.extend(f"          {site}" for site in stack)
    return "\n".join(lines)


def report_recompile(
    fn: Callable,
    failures: Sequence[Failure | Sequence[Failure] | None],
    names: Sequence[str | None] | None = None,
    *,
    error: bool = False,
) -> str | None:
    """Log the recompile reason on ``tripwire.recompiles`` at INFO (when enabled), or raise
    :class:`tripwire.RecompileError` with it when ``error`` is true. Returns the message, or None
    when nothing was formatted."""
    if error:
        raise RecompileError(format_recompile(fn, failures, names), tuple(failures))
    if not RECOMPILES.isEnabledFor(logging.INFO):
        return None
    msg = format_recompile(fn, failures, names)
    RECOMPILES.info("%s", msg)
    return msg


def report_recompile_of(
    fn: Callable, cache: Any, f_locals: Any, *, error: bool = False, record: bool = False
) -> tuple[list[str | None], list[Any]] | None:
    """Why each entry of ``cache`` failed on ``f_locals``, computed only when it is used: logged
    on ``tripwire.recompiles`` (each entry's first failing guard, or with ``recompiles_verbose``
    every failing guard), raised as :class:`tripwire.RecompileError` when ``error`` (its
    ``failures`` stay one per entry), or wanted by the caller (``record``). Returns the entries'
    names and first failures when computed, else None."""
    log = RECOMPILES.isEnabledFor(logging.INFO)
    if not (error or log or record):
        return None
    entries = list(cache)
    firsts = cache.why_not(f_locals)
    if len(firsts) != len(entries):
        # An entry was dropped in between (an identity-held object died during a collection that
        # ran inside why_not): the names would no longer line up with the failures.
        names: list[str | None] | None = None
        shown: list[Any] = list(firsts)
    else:
        names = [e.name for e in entries]
        shown = list(firsts)
        if (error or log) and RECOMPILES.isEnabledFor(logging.DEBUG):
            for i, (e, first) in enumerate(zip(entries, firsts, strict=True)):
                # why_not's failure is a probe's (global state, index -1) or the set's first guard.
                if first is not None and first.guard.index >= 0:
                    shown[i] = e.guards.failures(f_locals) or first
    if error:
        raise RecompileError(format_recompile(fn, shown, names), tuple(firsts))
    if log:
        RECOMPILES.info("%s", format_recompile(fn, shown, names))
    return (list(names) if names is not None else [None] * len(firsts)), list(firsts)


def report_compile(fn: Callable, name: str, guards: Any, seconds: float) -> None:
    """Log one compile on ``tripwire.compile`` and its guards on ``tripwire.guards`` (each when
    enabled): ``name`` is the cache entry's name, ``seconds`` how long compiling took."""
    if COMPILES.isEnabledFor(logging.INFO):
        qualname, where = _where(fn)
        COMPILES.info(
            "Compiled function %s in %s as %r in %.3f ms: %d guards on %d sources",
            qualname,
            where,
            name,
            seconds * 1e3,
            len(guards),
            guards.node_count,
        )
    if GUARDS.isEnabledFor(logging.INFO):
        qualname, where = _where(fn)
        GUARDS.info("GUARDS of %s (%s in %s):\n%s", name, qualname, where, guards.explain())


_configure_from_env()
