"""Facts about the installed package that every layer may read: its version and its cache
directory (the store's default directory and the torch adapter's builds)."""

from __future__ import annotations

import os
from pathlib import Path

__version__ = "0.1.0"


def default_cache_dir() -> Path:
    """``$TRIPWIRE_CACHE_DIR``, else ``$XDG_CACHE_HOME/tripwire``, else ``~/.cache/tripwire``."""
    explicit = os.environ.get("TRIPWIRE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tripwire"
