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

from . import frame, store
from .builder import Checkpoint, GuardBuilder
from .cache import Cache, CacheEntry
from .catalogue import GuardKind, GuardSpec
from .errors import (
    FormatError,
    FrameError,
    GuardBuildError,
    GuardEvalError,
    IncompatibleCodeError,
    NotSerializable,
    RecompileError,
    RecompileLimitExceeded,
    SourceParseError,
    TripwireError,
)
from .failure import Failure
from .guard_set import GuardSet
from .infer import Policy, guards_for, infer_into
from .logs import format_recompile, set_logs
from .source import RootKind, Source, Step, StepKind
from .specialized import Specialized, specialize

__version__ = "0.1.0"

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
    "IncompatibleCodeError",
    "NotSerializable",
    "Policy",
    "RecompileError",
    "RecompileLimitExceeded",
    "RootKind",
    "Source",
    "SourceParseError",
    "Specialized",
    "Step",
    "StepKind",
    "TripwireError",
    "format_recompile",
    "frame",
    "guards_for",
    "infer_into",
    "set_logs",
    "specialize",
    "store",
]
