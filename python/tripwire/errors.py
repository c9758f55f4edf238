"""tripwire's exception types: one per failure class."""

from __future__ import annotations

__all__ = [
    "GuardBuildError",
    "GuardEvalError",
    "GuardsNotImportable",
    "RecompileError",
    "RecompileLimitExceeded",
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
