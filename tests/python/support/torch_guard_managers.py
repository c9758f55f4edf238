"""torch's own guard manager for a function torch.compile compiled once, and its decision: what the
tensor tests compare tripwire's answers with. Imported only by tests that have torch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list


def guard_manager_of(fn: Callable[..., Any], *args: Any, **compile_kwargs: Any) -> Any:
    """The guard manager of the one cache entry torch.compile (eager backend) makes for ``fn``
    called with ``args``, after a reset."""
    torch._dynamo.reset()
    torch.compile(fn, backend="eager", **compile_kwargs)(*args)
    (entry,) = _debug_get_cache_entry_list(fn.__code__)
    return entry.guard_manager


def torch_decides(gm: Any, f_locals: dict) -> bool:
    """``gm.check(f_locals)``; an exception counts as a failure (torch's leaves can raise, or
    return with an error set)."""
    try:
        return bool(gm.check(f_locals))
    except Exception:
        return False
