"""Stores for compiled entries: guards plus payload as bytes, shared across processes and machines.

An *entry* is what ``@specialize`` caches: a guard set (tripwire's format, docs/format.md) and
the compiled payload, turned into bytes by a *codec*. Stores keep entries by namespace (one per
function, code, backend and Python version) and never run code from what they read: guards load
through :meth:`tripwire.GuardSet.from_bytes`, payloads through the codec, whose default
(:class:`ReferenceCodec`) stores a module-level object by name, like the guards' references.

* :class:`Directory` (the default kind; under the user cache directory): atomic writes (a
  temporary file, fsync, rename), safe with several writers, corrupt or foreign-version entries
  skipped with one warning, size-based eviction.
* :class:`Redis`: a server shared by a fleet (redis-py). When it is down, or stops, lookups miss
  and compiling goes on, with one warning; entries not written yet are kept and written when it is
  back.

Layout of an entry (all integers little-endian; docs/store.md)::

    0   8  magic "\\x89TWE\\r\\n\\x1a\\n"
    8   2  entry format version (1)
    10  2  flags (0)
    12  4  guards length G
    16  4  codec name length C
    20  4  payload length P
    24  32 SHA-256 of everything after this header
    56  G  the guard set (docs/format.md)
        C  the codec's name (UTF-8)
        P  the payload
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import struct
import sys
import tempfile
import threading
import time
import types
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .errors import FormatError, NotSerializable
from .references import RefKind, Unnamed, fingerprint, name_of, resolve_name

__all__ = [
    "BytesCodec",
    "Codec",
    "Directory",
    "Entry",
    "Redis",
    "ReferenceCodec",
    "Store",
    "StoreWarning",
    "decode_entry",
    "default_cache_dir",
    "encode_entry",
]

log = logging.getLogger("tripwire.store")

ENTRY_MAGIC = b"\x89TWE\r\n\x1a\n"
ENTRY_VERSION = 1
_HEADER = struct.Struct("<8sHHIII32s")
_MAX_ENTRY = 512 << 20


class StoreWarning(UserWarning):
    """A store could not be read or written (a corrupt entry, a server down): compiling goes on."""


@dataclass(frozen=True)
class Entry:
    """A decoded entry: the guards' bytes, the codec's name and the payload's bytes."""

    guards: bytes
    codec: str
    payload: bytes


def encode_entry(guards: bytes, codec: str, payload: bytes) -> bytes:
    name = codec.encode()
    rest = guards + name + payload
    head = _HEADER.pack(
        ENTRY_MAGIC, ENTRY_VERSION, 0, len(guards), len(name), len(payload), hashlib.sha256(rest).digest()
    )
    return head + rest


def decode_entry(data: bytes) -> Entry:
    """Parse an entry; FormatError (with the byte offset) for anything else."""
    if len(data) < _HEADER.size:
        raise FormatError(f"truncated entry: {len(data)} bytes, the header alone is {_HEADER.size}", 0)
    magic, version, flags, g, c, p, digest = _HEADER.unpack_from(data)
    if magic != ENTRY_MAGIC:
        raise FormatError("not a tripwire store entry (wrong magic number)", 0)
    if version != ENTRY_VERSION:
        raise FormatError(f"entry format version {version} is not one this build reads ({ENTRY_VERSION})", 8)
    if flags:
        raise FormatError(f"unknown entry flags {flags}", 10)
    if _HEADER.size + g + c + p != len(data):
        raise FormatError(
            f"{'truncated: ' if _HEADER.size + g + c + p > len(data) else ''}the header declares "
            f"{g + c + p} bytes after it, {len(data) - _HEADER.size} are present",
            12,
        )
    rest = data[_HEADER.size :]
    if hashlib.sha256(rest).digest() != digest:
        raise FormatError("entry content hash mismatch: the entry is corrupt", 24)
    try:
        codec = rest[g : g + c].decode()
    except UnicodeDecodeError:
        raise FormatError("the codec name is not UTF-8", _HEADER.size + g) from None
    return Entry(rest[:g], codec, rest[g + c :])


# -- codecs ------------------------------------------------------------------------------------------


class Codec(Protocol):
    """Turns a compiled payload into bytes and back. ``encode`` raises NotSerializable for a
    payload it cannot store (the entry then stays in memory only). ``decode`` must not run code
    from the data."""

    name: str

    def encode(self, payload: Any) -> bytes: ...

    def decode(self, data: bytes) -> Any: ...


class ReferenceCodec:
    """The default codec: a payload that a module attribute holds (a module-level function, a
    class, a module) is stored as its reference, ``module:qualname`` plus fingerprint, and loaded
    by looking the name up in an imported module and comparing the fingerprint. Closures,
    lambdas, built-ins and instances are refused (NotSerializable): give ``@specialize`` a codec
    of your own for them.

    A payload is *called* on every hit, with the caller's arguments: the bytes must not choose
    which imported function that is (``subprocess.getoutput`` is a module-level function too).
    ``modules`` are the module-name prefixes payloads may come from (``"pkg"`` admits ``pkg``
    and ``pkg.sub``); ``@specialize`` gives its default codec the specialised function's module
    and the compiler's. With no modules, nothing loads.
    """

    name = "reference"

    def __init__(self, modules: Iterable[str] = ()) -> None:
        self.modules = tuple(modules)

    def _admits(self, module: str) -> bool:
        return any(module == p or module.startswith(p + ".") for p in self.modules)

    def encode(self, payload: Any) -> bytes:
        try:
            kind, module, qualname = name_of(payload, files=dict)
            python_function = kind is RefKind.FUNCTION and type(payload) is types.FunctionType
            if not (python_function or kind is RefKind.TYPE):
                raise Unnamed(
                    f"a {type(payload).__name__} payload: only Python functions and classes are stored by name"
                )
            if not self._admits(module):
                raise Unnamed(f"{module}:{qualname} is not in the codec's modules {list(self.modules)}")
        except Unnamed as e:
            raise NotSerializable([("payload", None, str(e))]) from None
        fp = fingerprint(kind, payload).hex()
        return json.dumps(
            {"kind": int(kind), "module": module, "qualname": qualname, "fingerprint": fp}
        ).encode()

    def decode(self, data: bytes) -> Any:
        try:
            ref = json.loads(data)
            kind, module, qualname, fp = (
                RefKind(ref["kind"]),
                ref["module"],
                ref["qualname"],
                ref["fingerprint"],
            )
        except (ValueError, KeyError, TypeError, RecursionError) as e:
            # RecursionError: json nests arrays without limit ("[" * 100_000).
            raise FormatError(f"not a reference payload: {e}") from None
        if (
            kind not in (RefKind.FUNCTION, RefKind.TYPE)
            or not isinstance(module, str)
            or not self._admits(module)
        ):
            raise FormatError(
                f"payload {module}:{qualname} refused: a payload is called on every hit, and only "
                f"functions and classes of the codec's modules {list(self.modules)} are loaded"
            )
        mod = sys.modules.get(module)
        if mod is None:
            raise FormatError(f"payload {module}:{qualname}: module {module!r} is not imported")
        try:
            obj = resolve_name(kind, mod, qualname)
        except LookupError as e:
            raise FormatError(f"payload {module}:{qualname} does not resolve: {e}") from None
        if not isinstance(obj, types.FunctionType if kind is RefKind.FUNCTION else type):
            raise FormatError(
                f"payload {module}:{qualname} is a {type(obj).__name__}, not a {kind.name.lower()}"
            )
        if fingerprint(kind, obj).hex() != fp:
            raise FormatError(
                f"payload {module}:{qualname} differs from the one saved (its fingerprint changed)"
            )
        return obj


class BytesCodec:
    """For compilers whose payload is already bytes (a serialized kernel, generated source)."""

    name = "bytes"

    def encode(self, payload: Any) -> bytes:
        if type(payload) is not bytes:
            raise NotSerializable(
                [("payload", None, f"BytesCodec stores bytes, not {type(payload).__name__}")]
            )
        return payload

    def decode(self, data: bytes) -> Any:
        return bytes(data)


# -- stores ------------------------------------------------------------------------------------------


class Store(Protocol):
    """Where entries live. ``load`` returns the raw entries of a namespace (corrupt ones are the
    caller's to skip); ``save`` writes one under a key (the same key, the same bytes)."""

    def load(self, namespace: str) -> list[bytes]: ...

    def save(self, namespace: str, key: str, data: bytes) -> None: ...


def default_cache_dir() -> Path:
    """``$TRIPWIRE_CACHE_DIR``, else ``$XDG_CACHE_HOME/tripwire``, else ``~/.cache/tripwire``."""
    explicit = os.environ.get("TRIPWIRE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tripwire"


class _OneWarning:
    """One warning per episode of trouble; a success ends the episode."""

    def __init__(self) -> None:
        self._warned = False
        self._lock = threading.Lock()

    def __call__(self, message: str) -> None:
        with self._lock:
            if self._warned:
                log.debug("%s", message)
                return
            self._warned = True
        log.warning("%s", message)
        warnings.warn(message, StoreWarning, stacklevel=4)

    def ok(self) -> None:
        self._warned = False


class Directory:
    """Entries as files under ``path`` (default :func:`default_cache_dir`): ``v1/<namespace>/<key>.twe``.

    Writes are atomic: a temporary file in the same directory, flushed and fsynced, renamed over
    the final name (a reader sees the old state or the whole entry, never part of one, even if
    the writer is killed), then the directory is fsynced. Several processes may write at once: an
    entry's name is its content hash, so two writers of one entry write the same bytes. Entries
    that fail their hash or format check are skipped with one warning (:class:`StoreWarning`).
    When the entries under ``path`` exceed ``max_bytes``, the oldest written are deleted until
    they fill at most 90% of it.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *, max_bytes: int = 256 << 20) -> None:
        self.path = Path(path) if path is not None else default_cache_dir()
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.max_bytes = max_bytes
        self._warn = _OneWarning()
        self.skipped: list[tuple[str, str]] = []  # (file, why) of entries skipped by load

    def __repr__(self) -> str:
        return f"tripwire.store.Directory({str(self.path)!r}, max_bytes={self.max_bytes})"

    def _dir(self, namespace: str) -> Path:
        return self.path / "v1" / namespace

    def load(self, namespace: str) -> list[bytes]:
        d = self._dir(namespace)
        try:
            names = sorted(p for p in os.listdir(d) if p.endswith(".twe"))
        except FileNotFoundError:
            return []
        except OSError as e:
            self._warn(f"tripwire: cannot read the store directory {d}: {e}")
            return []
        out = []
        for name in names:
            try:
                data = (d / name).read_bytes()
            except FileNotFoundError:
                continue  # evicted by another process meanwhile
            except OSError as e:
                self._skip(d / name, f"cannot be read: {e}")
                continue
            try:
                decode_entry(data)
            except FormatError as e:
                self._skip(d / name, str(e))
                continue
            out.append(data)
        return out

    def _skip(self, path: Path, why: str) -> None:
        self.skipped.append((str(path), why))
        self._warn(f"tripwire: skipped store entry {path}: {why}")

    def save(self, namespace: str, key: str, data: bytes) -> None:
        d = self._dir(namespace)
        final = d / f"{key}.twe"
        try:
            d.mkdir(parents=True, exist_ok=True)
            if final.exists():
                return  # the same key is the same bytes
            self._write(d, final, data)
            self._evict()
        except OSError as e:
            self._warn(f"tripwire: cannot write to the store directory {d}: {e}")

    def _write(self, d: Path, final: Path, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".part", dir=d)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        dir_fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def entries(self) -> list[tuple[Path, int, float]]:
        """Every entry file: (path, size, mtime), oldest first."""
        out = []
        root = self.path / "v1"
        now = time.time()
        try:
            namespaces = os.listdir(root)
        except FileNotFoundError:
            return []
        for ns in namespaces:
            try:
                names = os.listdir(root / ns)
            except OSError:
                continue
            for name in names:
                if name.startswith(".tmp-") and name.endswith(".part"):
                    # A writer killed mid-write leaves its temporary file; never read, removed
                    # once it is an hour old (a live writer finishes long before).
                    try:
                        if now - os.stat(root / ns / name).st_mtime > 3600:
                            os.unlink(root / ns / name)
                    except OSError:
                        pass
                    continue
                if not name.endswith(".twe"):
                    continue
                try:
                    st = os.stat(root / ns / name)
                except FileNotFoundError:
                    continue
                out.append((root / ns / name, st.st_size, st.st_mtime))
        out.sort(key=lambda e: e[2])
        return out

    def _evict(self) -> None:
        entries = self.entries()
        total = sum(size for _, size, _ in entries)
        if total <= self.max_bytes:
            return
        target = self.max_bytes * 9 // 10
        for path, size, _ in entries:
            if total <= target:
                break
            try:
                os.unlink(path)
                total -= size
            except FileNotFoundError:
                total -= size  # another process evicted it
        log.info("tripwire: store %s evicted down to %d bytes", self.path, total)


class Redis:
    """Entries in a Redis server (redis-py), for a fleet of machines: ``<prefix>:v1:<namespace>``
    is the set of a namespace's keys, ``<prefix>:v1:<namespace>:<key>`` an entry. ``ttl``
    (seconds) expires entries; the server's ``maxmemory`` policy may also evict them (a key whose
    entry is gone is dropped from the set).

    When the server cannot be reached (down at start, or stopping mid-run), loads return nothing
    and saves are kept in memory (up to ``pending_limit`` entries), with one
    :class:`StoreWarning` per outage; the next successful contact writes them. Compiling goes on
    either way.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "tripwire",
        ttl: int | None = None,
        timeout: float = 1.0,
        pending_limit: int = 1024,
        client: Any = None,
    ) -> None:
        import redis

        self.url = url
        self.prefix = prefix
        self.ttl = ttl
        self.pending_limit = pending_limit
        self._errors = (redis.exceptions.RedisError, OSError)
        self._client = client or redis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout
        )
        self._warn = _OneWarning()
        self._pending: list[tuple[str, str, bytes]] = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"tripwire.store.Redis({self.url!r}, prefix={self.prefix!r})"

    def _set_key(self, namespace: str) -> str:
        return f"{self.prefix}:v1:{namespace}"

    def entry_key(self, namespace: str, key: str) -> str:
        """The Redis key of one entry (``python -m tripwire inspect redis://host:port/<this>``)."""
        return f"{self.prefix}:v1:{namespace}:{key}"

    def _down(self, what: str, e: BaseException) -> None:
        self._warn(
            f"tripwire: Redis store {self.url} unavailable while {what} ({type(e).__name__}: {e}); "
            "compiling locally, unsaved entries are kept and written when it is back"
        )

    def _flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for i, (ns, key, data) in enumerate(pending):
            try:
                self._write(ns, key, data)
            except self._errors:
                with self._lock:
                    self._pending[:0] = pending[i:]
                raise

    def _write(self, namespace: str, key: str, data: bytes) -> None:
        pipe = self._client.pipeline()
        pipe.set(self.entry_key(namespace, key), data, ex=self.ttl)
        pipe.sadd(self._set_key(namespace), key)
        pipe.execute()

    def save(self, namespace: str, key: str, data: bytes) -> None:
        try:
            self._flush()
            self._write(namespace, key, data)
            self._warn.ok()
        except self._errors as e:
            with self._lock:
                if len(self._pending) < self.pending_limit:
                    self._pending.append((namespace, key, data))
            self._down("saving", e)

    def load(self, namespace: str) -> list[bytes]:
        try:
            self._flush()
            keys = sorted(
                k.decode() if isinstance(k, bytes) else k
                for k in self._client.smembers(self._set_key(namespace))
            )
            if not keys:
                self._warn.ok()
                return []
            values = self._client.mget([self.entry_key(namespace, k) for k in keys])
            gone = [k for k, v in zip(keys, values, strict=True) if v is None]
            if gone:
                self._client.srem(self._set_key(namespace), *gone)
            self._warn.ok()
        except self._errors as e:
            self._down("loading", e)
            return []
        out = []
        for k, v in zip(keys, values, strict=True):
            if v is None:
                continue
            try:
                decode_entry(v)
            except FormatError as e:
                self._warn(f"tripwire: skipped Redis entry {self.entry_key(namespace, k)}: {e}")
                continue
            out.append(bytes(v))
        return out

    @property
    def pending(self) -> int:
        """Entries waiting for the server."""
        return len(self._pending)


def entry_key(data: bytes) -> str:
    """An entry's name: the hash of its bytes (the same entry, the same name, from any writer)."""
    return hashlib.sha256(data).hexdigest()[:32]


def namespace_of(parts: Iterable[str]) -> str:
    """A namespace: the hash of what must match for entries to be shared (function, code,
    backend, codec, Python version, format version)."""
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).hexdigest()[:32]
