"""Failure: why a guard set did not pass, as one readable record."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .catalogue import GuardKind, GuardSpec, short_repr

__all__ = ["Failure", "make_failure"]


@dataclass(frozen=True)
class Failure:
    """The first failing guard (by installation order) of a check.

    Attributes:
        source: the printed source, e.g. ``"L['cfg']['mode']"`` (None for ambient guards).
        kind: the catalogue name, e.g. ``"EQUALS_MATCH"``.
        expected: what the guard expects (a type, constant, length, key list...).
        actual: what was found (the value's type for TYPE_MATCH, its length for LENGTH, the
            value otherwise); None when the source could not be fetched.
        reason: one readable line.
        guard: the GuardSpec, with ``.stack``: where the guard was installed.
    """

    source: str | None
    kind: str
    expected: Any
    actual: Any
    reason: str
    guard: GuardSpec

    @property
    def stack(self) -> tuple[str, ...]:
        return self.guard.stack

    def __str__(self) -> str:
        return self.reason


def _actual(spec: GuardSpec, v: Any) -> Any:
    k = spec.kind
    try:
        if k is GuardKind.TYPE_MATCH:
            return type(v)
        if k is GuardKind.LENGTH:
            return len(v)
        if k is GuardKind.DICT_KEYS and isinstance(v, dict):
            return list(dict.keys(v))
        if k is GuardKind.CODE_MATCH:
            return getattr(v, "__code__", None)
    except Exception:  # noqa: BLE001 - diagnostics must not raise
        return v
    return v


def _shape_failure(spec: GuardSpec, value: Any, error: str | None) -> Failure:
    """A SHAPE relation: ``expected`` is the relation, ``actual`` {symbol: value} (None when a
    symbol could not be read), ``source`` its symbols."""
    text, symbols = spec.args[0], spec.args[1]
    src = ", ".join(str(s) for s in symbols) or None
    if type(value) is dict:
        # The engine's reason: "<relation> is false with L['x'].size()[0] = 9".
        return Failure(src, "SHAPE", text, value, error or f"{text} is false", spec)
    return Failure(src, "SHAPE", text, None, f"{text}: {error}", spec)


def make_failure(spec: GuardSpec, value: Any, error: str | None, fetch_failed: bool) -> Failure:
    """Build the Failure for guard ``spec`` that saw ``value`` (or could not fetch it)."""
    if spec.kind is GuardKind.SHAPE and not (error is not None and "has died" in error and value is None):
        return _shape_failure(spec, value, error)
    src = str(spec.source) if spec.source is not None else None
    where = src or "global state"
    kind = spec.kind.name
    expected = spec.expected
    if fetch_failed:
        reason = f"{where}: cannot be read ({error}); {kind} expected {short_repr(expected)}"
        return Failure(src, kind, expected, None, reason, spec)
    if error is not None and "has died" in error and value is None:
        return Failure(src, kind, expected, None, f"{where}: {kind} can never pass: {error}", spec)
    actual = _actual(spec, value)
    if error is not None:
        reason = f"{where}: {kind} raised {error}"
    elif spec.kind is GuardKind.GLOBAL_STATE:
        reason = f"global state {spec.args[2]!r} changed: expected {short_repr(expected)}"
    else:
        reason = f"{where}: {kind} expected {short_repr(expected)}, got {short_repr(actual)} ({spec.describe()} is false)"
    return Failure(src, kind, expected, actual, reason, spec)
