"""tripwire's exception types: one per failure class."""

from __future__ import annotations

__all__ = [
    "FormatError",
    "FrameError",
    "GuardBuildError",
    "GuardEvalError",
    "GuardsNotImportable",
    "IncompatibleCodeError",
    "NotSerializable",
    "RecompileError",
    "RecompileLimitExceeded",
    "ShapeSyntaxError",
    "SourceParseError",
    "TorchImportError",
    "TripwireError",
]

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


class TorchImportError(TripwireError):
    """``tripwire.torch.guards_of`` cannot import a torch cache entry: the object has no compiled
    entry, the entry index is out of range, or the entry was invalidated."""


class GuardsNotImportable(TorchImportError):
    """Guards of a torch cache entry that ``guards_of`` cannot import exactly and the caller did not
    name in ``drop=``. ``guards`` lists each one (a ``tripwire.torch.TorchGuard``: ``.source``,
    ``.kind``, ``.code``, ``.why``); nothing was imported."""

    def __init__(self, message: str, guards: tuple = ()) -> None:
        super().__init__(message)
        self.guards = tuple(guards)


class FrameError(TripwireError, RuntimeError):
    """The frame runtime (:mod:`tripwire.frame`) cannot hook this interpreter: another PEP 523
    eval-frame function is installed, or the interpreter's frame layout did not verify (an
    unsupported version or build)."""


class IncompatibleCodeError(TripwireError, TypeError):
    """A frame callback returned a replacement code object that cannot run in the frame's
    layout (different argument slots or free variables, or a generator); the message says
    which."""


class FormatError(TripwireError, ValueError):
    """Bytes that are not a guard set this build can load: wrong magic, a newer format version,
    truncated or corrupt data (the content hash), an invalid record, or a reference that is
    refused, missing, or resolves to an object other than the one saved. The message says what is
    wrong and where; ``offset`` is the byte offset (None when the problem is not at one place)."""

    def __init__(self, message: str, offset: int | None = None) -> None:
        super().__init__(message)
        self.offset = offset


class NotSerializable(TripwireError):
    """``GuardSet.to_bytes()`` met guards whose meaning cannot survive the process (an identity
    no name leads to, a dict version, a predicate, a closure cell...). ``guards`` lists every one
    as ``(kind, source, reason)``; ``to_bytes(drop=[...])`` leaves out what the caller names."""

    def __init__(self, guards: list[tuple[str, str | None, str]]) -> None:
        self.guards = list(guards)
        lines = [f"  {k} on {s or 'global state'}: {why}" for k, s, why in self.guards]
        super().__init__(
            f"{len(self.guards)} guard(s) cannot be serialized (drop them explicitly with "
            "to_bytes(drop=[source or kind, ...]) to save the rest):\n" + "\n".join(lines)
        )
