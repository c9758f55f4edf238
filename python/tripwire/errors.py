"""tripwire's exception types: one per failure class."""

from __future__ import annotations

__all__ = [
    "GuardBuildError",
    "GuardEvalError",
    "RecompileError",
    "RecompileLimitExceeded",
    "ShapeSyntaxError",
    "SourceParseError",
    "TripwireError",
]

from . import _core
from .source import SourceParseError


class TripwireError(Exception):
    """Base class of tripwire's own errors."""


class GuardBuildError(TripwireError, ValueError):
    """A guard cannot be built: its source cannot be read from the example, its constant is not
    a constant type, or the built set does not pass on the example it was built from."""


class ShapeSyntaxError(GuardBuildError):
    """Text of a shape relation that tripwire cannot use: a syntax error, an unknown function or
    name, a source it cannot parse, a type error (a float ``**``, arithmetic on a comparison, ``min``
    of an int and a float), or nesting over the limit. ``offset`` is the index in ``text`` (a str
    index) where the problem is; ``text`` the relation as given (None when not known)."""

    def __init__(self, message: str, offset: int, text: str | None = None) -> None:
        self.message = message
        self.offset = offset
        self.text = text
        where = f"at offset {offset}"
        if text is not None:
            where += f" of {text!r}"
        super().__init__(f"{message} ({where})")

    def __reduce__(self) -> tuple:
        return (type(self), (self.message, self.offset, self.text))


# The engine raises this class for text errors found in C++ (with the offset it found).
_core._set_shape_syntax_error(ShapeSyntaxError)


class GuardEvalError(TripwireError, RuntimeError):
    """Raised by ``check`` of a set built with ``strict=True`` when a source or guard raised;
    the original exception is its ``__cause__``."""


class RecompileError(TripwireError, RuntimeError):
    """A specialised function missed its cache while ``error_on_recompile`` was set; the message
    is the recompile reason (``tripwire.logs.format_recompile``), ``failures`` the per-entry
    :class:`tripwire.Failure` list."""

    def __init__(self, message: str, failures: tuple = ()) -> None:
        super().__init__(message)
        self.failures = tuple(failures)


class RecompileLimitExceeded(TripwireError):
    """``Cache.insert`` under ``on_limit="raise"`` would exceed a limit. ``limit`` is the limit's
    name (``"recompile_limit"`` or ``"accumulated_limit"``), ``value`` its value, ``reasons`` why
    the existing entries failed (Failure strings; empty when the caller gave no locals)."""

    def __init__(self, limit: str, value: int, reasons: list[str]) -> None:
        self.limit = limit
        self.value = value
        self.reasons = list(reasons)
        msg = f"{limit} ({value}) reached"
        if self.reasons:
            msg += ": " + "; ".join(self.reasons)
        super().__init__(msg)
