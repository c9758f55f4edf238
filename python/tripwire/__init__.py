"""tripwire: a C++ guard engine for Python JIT compilers.

Build guards against example values, check them in nanoseconds, explain failures::

    import tripwire as tw
    b = tw.GuardBuilder({"x": 3, "cfg": {"mode": "fast"}})
    b.type_match("L['x']"); b.equals("L['cfg']['mode']")
    gs = b.build()
    gs.check({"x": 4, "cfg": {"mode": "fast"}})   # True
    gs.why_not({"x": 4, "cfg": {"mode": "slow"}}) # Failure(source="L['cfg']['mode']", ...)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import frame, shapes, store, tensors
from ._package import __version__ as __version__
from .builder import Checkpoint, GuardBuilder
from .cache import Cache, CacheEntry, record_recompiles
from .catalogue import GuardKind, GuardSpec, register_constant_type
from .errors import (
    FormatError,
    FrameError,
    GuardBuildError,
    GuardEvalError,
    GuardsNotImportable,
    IncompatibleCodeError,
    NotSerializable,
    RecompileError,
    RecompileLimitExceeded,
    ShapeSyntaxError,
    SourceParseError,
    TorchImportError,
    TripwireError,
)
from .failure import Failure
from .guard_set import GuardSet
from .html_report import report
from .infer import Policy, guards_for, infer_into
from .logs import format_recompile, set_logs
from .overview import Summary, summary
from .source import RootKind, Source, Step, StepKind
from .specialized import Specialized, specialize

if TYPE_CHECKING:
    # For type checkers only: at run time ``tripwire.torch`` is imported on first use (below).
    from . import torch as torch


def __getattr__(name: str) -> object:
    # ``tripwire.torch`` (guards_of) on first use; it imports torch only when called.
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'tripwire' has no attribute {name!r}")


__all__ = [
    "Cache",
    "CacheEntry",
    "Checkpoint",
    "Failure",
    "FormatError",
    "FrameError",
    "GuardBuildError",
    "GuardBuilder",
    "GuardEvalError",
    "GuardKind",
    "GuardSet",
    "GuardSpec",
    "GuardsNotImportable",
    "IncompatibleCodeError",
    "NotSerializable",
    "Policy",
    "RecompileError",
    "RecompileLimitExceeded",
    "RootKind",
    "ShapeSyntaxError",
    "Source",
    "SourceParseError",
    "Specialized",
    "Step",
    "StepKind",
    "Summary",
    "TorchImportError",
    "TripwireError",
    "format_recompile",
    "frame",
    "guards_for",
    "infer_into",
    "record_recompiles",
    "register_constant_type",
    "report",
    "set_logs",
    "shapes",
    "specialize",
    "store",
    "summary",
    "tensors",
]
