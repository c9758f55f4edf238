"""Import what ``torch.compile`` decided: the guards of a Dynamo cache entry as a tripwire GuardSet.

::

    import tripwire.torch
    cm = torch.compile(model, backend="eager"); cm(x)
    gs = tripwire.torch.guards_of(model)
    gs.check({"self": model, "x": x})       # decides as the entry's guard_manager.check does
    print(gs.explain())                      # the tree, then what came from where (and what not)

Importing ``tripwire`` or ``tripwire.torch`` never imports torch; :func:`guards_of` does. The
mapping of every torch accessor and leaf kind is in docs/torch.md and in ``_rules``.
"""

from __future__ import annotations

from typing import Any

from ..errors import GuardsNotImportable, TorchImportError
from . import _rules
from ._guards_of import frame_locals, guards_of, install_dynamo_globals
from ._imported import OUTCOMES, Exemption, ImportedGuardSet, TorchGuard, TorchImport

__all__ = [
    "OUTCOMES",
    "PENDING_KINDS",
    "Exemption",
    "GuardsNotImportable",
    "ImportedGuardSet",
    "TorchGuard",
    "TorchImport",
    "TorchImportError",
    "compile",
    "frame_locals",
    "guards_of",
    "install_dynamo_globals",
    "reset",
]

# The torch kinds tripwire cannot import yet: since the tensor engine (issue 9) only the accessors
# into a tensor (.size(i) / .stride(i) / .grad steps, symbolic-shape arguments), which
# dynamic=False compiles do not produce. ``drop=PENDING_KINDS`` imports the rest.
PENDING_KINDS: tuple[str, ...] = (*_rules.PENDING_KINDS, *_rules.PENDING_ACCESSORS)


def compile(model: Any = None, **kwargs: Any) -> Any:
    """``torch.compile(model, **kwargs)`` served by tripwire's frame runtime and guards: Dynamo
    compiles, tripwire checks the imported guards and runs the compiled code. Exactly
    torch.compile's keyword arguments and defaults (docs/compile.md; imports torch)."""
    from ._compile import compile as _compile

    return _compile(model, **kwargs)


def reset() -> None:
    """Forget every entry ``tripwire.torch.compile`` compiled (``torch._dynamo.reset()`` does too)."""
    import sys

    if "tripwire.torch._compile" in sys.modules:
        from ._compile import reset as _reset

        _reset()
