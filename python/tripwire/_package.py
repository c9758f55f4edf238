"""Facts about the installed package that every layer may read: its version, its cache
directory (the store's default directory and the torch adapter's builds) and which files are its
own."""

from __future__ import annotations

import functools
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


_PKG_DIR = os.path.dirname(os.path.abspath(__file__))


@functools.lru_cache(maxsize=1024)
def is_own_file(filename: str) -> bool:
    """Whether code of this file is tripwire's own machinery: every module of the package's
    directory, except the demo, which plays the user. The one definition: the install-site walk
    (builder._is_machinery) and the frame hook (frame.Hook, which skips these frames on a miss)
    ask it. Memoised: the hook asks it once per intercepted miss."""
    path = os.path.abspath(filename)
    return os.path.dirname(path) == _PKG_DIR and os.path.basename(path) != "demo.py"
