"""Recompile reasons: the ``tripwire.recompiles`` logger and ``TRIPWIRE_LOGS``.

When a specialised function misses a cache that already holds entries, tripwire explains why each
entry did not pass and logs it at INFO on ``logging.getLogger("tripwire.recompiles")``, as
``TORCH_LOGS=recompiles`` does for Dynamo. The message names the function and its file:line, and
for each cached entry the failing guard's source, kind, expected and actual values, and the user
stack that installed the guard (innermost frame last).

Enable it from the environment (read once, when tripwire is imported)::

    TRIPWIRE_LOGS=recompiles python my_program.py

or from code with ``tw.set_logs("recompiles")`` (``tw.set_logs("")`` turns it off again). Either
attaches one stderr handler at INFO to the logger; it still propagates, so the application's own
logging configuration (and pytest's ``caplog``) sees the records too. Configuring the logger
directly with :mod:`logging` works as well: tripwire only formats a reason when the logger is
enabled for INFO, so a disabled logger costs nothing on a miss.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .catalogue import short_repr
from .errors import RecompileError
from .failure import Failure

__all__ = [
    "LOG_NAMES",
    "RECOMPILES",
    "format_recompile",
    "parse_logs",
    "recompile_logging_enabled",
    "report_recompile",
    "set_logs",
]

RECOMPILES = logging.getLogger("tripwire.recompiles")

# Names accepted in TRIPWIRE_LOGS / set_logs, mapped to their logger.
LOG_NAMES = {"recompiles": RECOMPILES}

_HANDLER_MARK = "_tripwire_logs_handler"


def parse_logs(spec: str | Iterable[str] | None) -> frozenset[str]:
    """The log names in ``spec``: a comma-separated string (``"recompiles"``, as in
    ``TRIPWIRE_LOGS``) or an iterable of names. Whitespace and case are ignored, empty items are
    skipped; an unknown name raises ValueError listing the known ones."""
    if spec is None:
        return frozenset()
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    names = set()
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"log names must be str, got {item!r}")
        name = item.strip().lower()
        if not name:
            continue
        if name not in LOG_NAMES:
            raise ValueError(f"unknown tripwire log {name!r}; known: {', '.join(sorted(LOG_NAMES))}")
        names.add(name)
    return frozenset(names)


def set_logs(spec: str | Iterable[str] | None = "", *, stream: Any = None) -> frozenset[str]:
    """Enable exactly the logs named in ``spec`` (see :func:`parse_logs`) and disable the others.

    An enabled log gets one handler writing to ``stream`` (default: ``sys.stderr`` at the time of
    the call) and level INFO; a disabled one loses that handler and goes back to level NOTSET
    (inheriting from its parents). Handlers added by the application are left alone. Returns the
    enabled names.
    """
    names = parse_logs(spec)
    for name, logger in LOG_NAMES.items():
        for h in list(logger.handlers):
            if getattr(h, _HANDLER_MARK, False):
                logger.removeHandler(h)
        if name in names:
            handler = logging.StreamHandler(sys.stderr if stream is None else stream)
            handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
            setattr(handler, _HANDLER_MARK, True)
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)
        else:
            logger.setLevel(logging.NOTSET)
    return names


def _configure_from_env() -> None:
    spec = os.environ.get("TRIPWIRE_LOGS")
    if not spec:
        return
    try:
        set_logs(spec)
    except (ValueError, TypeError) as e:  # importing tripwire must not fail on a typo
        sys.stderr.write(f"tripwire: ignoring TRIPWIRE_LOGS={spec!r}: {e}\n")


def recompile_logging_enabled() -> bool:
    """Whether a recompile reason would be logged (the logger is enabled for INFO)."""
    return RECOMPILES.isEnabledFor(logging.INFO)


def _where(fn: Callable) -> tuple[str, str]:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        return name, "<unknown>"
    return name, f"{code.co_filename}:{code.co_firstlineno}"


def format_recompile(
    fn: Callable, failures: Sequence[Failure | None], names: Sequence[str | None] | None = None
) -> str:
    """The recompile reason for ``fn`` given one :class:`Failure` per cached entry (most recently
    used first, as ``Cache.why_not`` returns them); ``names`` optionally names the entries.

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
    for i, f in enumerate(failures):
        label = f"entry {i}"
        if names is not None and i < len(names) and names[i] is not None:
            label += f" {names[i]!r}"
        if f is None:
            lines.append(f"    - {label}: passes (another entry was preferred)")
            continue
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
    failures: Sequence[Failure | None],
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


_configure_from_env()
