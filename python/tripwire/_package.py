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
# The separator ends the prefix: a sibling directory whose name starts with the package's
# ("tripwire_ext/") is someone else's.
_PKG_PREFIX = _PKG_DIR + os.sep
_DEMO = os.path.join(_PKG_DIR, "demo.py")


@functools.lru_cache(maxsize=1024)
def is_own_file(filename: str) -> bool:
    """Whether code of this file is tripwire's own machinery: every module under the package's
    directory, its subpackages' too (tripwire.torch's route, fallback and LAMBDA helpers), except
    the demo, which plays the user. The one definition: the install-site walk
    (builder._is_machinery) and the frame hook (frame.Hook, which skips these frames on a miss,
    before any callback, tripwire.torch.compile's included) ask it. Memoised: the hook asks it
    once per intercepted miss."""
    path = os.path.abspath(filename)  # normalised: "tripwire/../x.py" is not the package's
    return path.startswith(_PKG_PREFIX) and path != _DEMO
