"""Stores for compiled entries: guards plus payload as bytes, shared across processes and machines.

An *entry* is what ``@specialize`` caches: a guard set (tripwire's format, docs/format.md) and
the compiled payload, turned into bytes by a *codec*. Stores keep entries by namespace (one per
function, code, backend and Python version) and never run code from what they read: guards load
through :meth:`tripwire.GuardSet.from_bytes`, payloads through the codec, whose default
(:class:`ReferenceCodec`) stores a module-level object by name, like the guards' references.

* :class:`Directory` (the default kind; under the user cache directory): atomic writes (a
  temporary file, fsync, rename), safe with several writers, special files never read,
  size-based eviction.
* :class:`Redis`: a server shared by a fleet (redis-py). When it is down, or stops, lookups miss
  and compiling goes on, with one warning per outage; entries not written yet are kept and
  written when it is back.

Stored bytes are untrusted: every entry is served correctly or skipped with one report. Each
namespace has a journal of its keys in the order saved, read from where the reader stopped, so a
store costs O(1) amortised per entry (docs/store.md).

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
import errno
import hashlib
import json
import logging
import os
import random
import re
import secrets
import stat
import struct
import sys
import threading
import time
import types
import warnings
from collections.abc import Container, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from ._package import default_cache_dir
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
    "entry_key",
    "namespace_of",
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
    """The default codec: a payload that is a module-level Python function or a class is stored as
    its reference, ``module:qualname`` plus fingerprint, and loaded by looking the name up in an
    imported module and comparing the fingerprint. Closures, lambdas, built-ins and instances are
    refused (NotSerializable): give ``@specialize`` a codec of your own for them.

    A payload is *called* on every hit, with the caller's arguments: the bytes must not choose
    which imported function that is (``subprocess.getoutput`` is a module-level function too).
    ``modules`` are the module-name prefixes payloads may come from (``"pkg"`` admits ``pkg``
    and ``pkg.sub``); ``@specialize`` gives its default codec the specialised function's module
    and the compiler's. With no modules, nothing loads. The name resolves as a called reference
    (references.resolve_name): to a function or class that its admitted module itself defines,
    never one it imported (``from subprocess import getoutput``) nor one reached through another
    module, a class's base or an attribute chain. A fingerprint is a public function of its
    target, so it is no defence; the admitted module and the resolution rule are.
    """

    name = "reference"

    def __init__(self, modules: Iterable[str] = ()) -> None:
        self.modules = tuple(modules)

    def _admits(self, module: str) -> bool:
        return any(module == p or module.startswith(p + ".") for p in self.modules)

    def encode(self, payload: Any) -> bytes:
        try:
            kind, module, qualname = name_of(payload, files=dict, called=True)
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
        # A reference is one flat JSON object: deeper nesting is refused before the parser, which
        # would recurse once per level.
        if isinstance(data, bytearray | memoryview):
            data = bytes(data)
        if type(data) is not bytes or data.count(b"{") + data.count(b"[") > 1:
            raise FormatError("not a reference payload: one flat JSON object is expected")
        try:
            ref = json.loads(data)
            kind, module, qualname, fp = (
                RefKind(ref["kind"]),
                ref["module"],
                ref["qualname"],
                ref["fingerprint"],
            )
        except (ValueError, KeyError, TypeError) as e:
            raise FormatError(f"not a reference payload: {type(e).__name__}: {e}") from None
        if type(module) is not str or type(qualname) is not str or type(fp) is not str:
            raise FormatError("not a reference payload: module, qualname and fingerprint are strings")
        if (
            type(ref["kind"]) is not int
            or kind not in (RefKind.FUNCTION, RefKind.TYPE)
            or not self._admits(module)
        ):
            raise FormatError(
                f"payload {module}:{qualname} refused: a payload is called on every hit, and only "
                f"functions and classes of the codec's modules {list(self.modules)} are loaded"
            )
        mod: Any = sys.modules.get(module)
        if not issubclass(type(mod), types.ModuleType):
            raise FormatError(f"payload {module}:{qualname}: module {module!r} is not imported")
        try:
            obj = resolve_name(kind, module, mod, qualname, called=True)
        except LookupError as e:
            raise FormatError(f"payload {module}:{qualname} does not resolve: {e}") from None
        if type(obj) is not types.FunctionType and kind is RefKind.FUNCTION:
            raise FormatError(f"payload {module}:{qualname} is a {type(obj).__name__}, not a Python function")
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

# Namespaces (namespace_of) and entry keys (entry_key) are 32 lowercase hex digits: a name from a
# caller or from the store's own index can never hold a separator, "..", or bytes that do not decode.
_NAME = re.compile(r"[0-9a-f]{32}")
_NAME_BYTES = re.compile(rb"[0-9a-f]{32}")


def _check_name(what: str, value: object) -> str:
    if type(value) is not str or _NAME.fullmatch(value) is None:
        raise ValueError(
            f"a store {what} is 32 lowercase hex digits (tripwire.store.namespace_of / entry_key), "
            f"not {value!r:.80}"
        )
    return value


def _check_entry(key: str, data: bytes) -> None:
    if type(data) is not bytes:
        raise TypeError(f"a store entry is bytes, not {type(data).__name__}")
    if len(data) > _MAX_ENTRY:
        raise ValueError(f"a store entry is at most {_MAX_ENTRY} bytes, this one is {len(data)}")
    if entry_key(data) != key:
        raise ValueError(f"an entry's key is entry_key(data), {entry_key(data)}, not {key}")


def _report(message: str) -> None:
    """Print one store message, once. The print goes through ``warnings`` (a StoreWarning, which
    the application's warning filters control); the same text is an INFO record on
    ``tripwire.store`` for applications that configure logging handlers. INFO, not WARNING:
    with no handler configured, logging's last-resort handler prints WARNING records to stderr,
    and every message would show twice."""
    log.info("%s", message)
    # Point the warning at the first frame outside tripwire (the caller of the specialised
    # function, or of the store method).
    frame: types.FrameType | None = sys._getframe(1)
    level = 2
    while frame is not None and str(frame.f_globals.get("__name__", "")).startswith("tripwire."):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, StoreWarning, stacklevel=level)


class _Health:
    """A store location's availability, shared by every store object for that location in the
    process: one message when an outage starts, one when it ends, and no attempt to reach the
    location for ``retry_after`` seconds after a failure (a call must not wait for a server that
    just failed)."""

    _all: ClassVar[dict[str, _Health]] = {}
    _all_lock = threading.Lock()

    def __init__(self, name: str, retry_after: float) -> None:
        self.name = name
        self.retry_after = retry_after
        self._down = False
        self._retry_at = 0.0
        self._lock = threading.Lock()

    @classmethod
    def of(cls, name: str, retry_after: float) -> _Health:
        with cls._all_lock:
            h = cls._all.get(name)
            if h is None:
                h = cls._all[name] = cls(name, retry_after)
            h.retry_after = retry_after
            return h

    def available(self) -> bool:
        return not self._down or time.monotonic() >= self._retry_at

    def failed(self, message: str) -> None:
        with self._lock:
            first = not self._down
            self._down = True
            self._retry_at = time.monotonic() + self.retry_after
        if first:
            _report(message)
        else:
            log.debug("%s", message)

    def ok(self, detail: str = "") -> None:
        if not self._down:
            return
        with self._lock:
            was, self._down = self._down, False
        if was:
            _report(f"tripwire: {self.name} is available again{detail}")


class Store(Protocol):
    """Where entries live, by namespace (:func:`namespace_of`) and key (:func:`entry_key` of the
    entry's bytes); both are 32 lowercase hex digits.

    ``read(namespace, position, known)`` returns the entries saved after ``position`` (None: from
    the start), and the position to pass next time; entries whose key is in ``known`` are passed
    over unread. Entries a store cannot read are its to skip and report; the caller validates
    the rest. ``save`` writes one entry; the same key is the same bytes. Neither raises for a
    store that is down or holds bad data (a :class:`StoreWarning` reports it)."""

    def read(
        self, namespace: str, position: Any = None, known: Container[str] = ()
    ) -> tuple[list[bytes], Any]: ...

    def save(self, namespace: str, key: str, data: bytes) -> None: ...


class _Reports:
    """Skip reports common to the stores: each bad entry and each bad namespace is reported once
    per store object, and the skipped entries are listed in ``skipped`` as (where, why)."""

    def __init__(self) -> None:
        self.skipped: list[tuple[str, str]] = []
        self._reported: set[tuple[str, str]] = set()
        self._reports_lock = threading.Lock()

    def _once(self, namespace: str, what: str) -> bool:
        with self._reports_lock:
            if (namespace, what) in self._reported:
                return False
            self._reported.add((namespace, what))
            return True

    def _skip(self, namespace: str, key: str, where: str, why: str) -> None:
        if self._once(namespace, key):
            self.skipped.append((where, why))
            _report(f"tripwire: skipped store entry {where}: {why}; it is recompiled when needed")

    def _bad_namespace(self, namespace: str, where: str, why: str) -> None:
        if self._once(namespace, "namespace"):
            _report(f"tripwire: store namespace {where} is unusable: {why}; its entries are recompiled")

    def load(self, namespace: str) -> list[bytes]:
        """Every readable entry of a namespace, in the order saved."""
        entries: list[bytes] = self.read(namespace)[0]  # type: ignore[attr-defined]
        return entries


# Opening anything in a store directory: never through a symbolic link, never waiting (a FIFO
# opens at once and is then refused by fstat), never acquiring a terminal.
_OPEN_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_JOURNAL = "journal"
_RECORD = 34  # b"\n" + 32 hex digits + b"\n"
_TEMP_MAX_AGE = 3600  # seconds after which a killed writer's temporary file is removed
_CHANCE = random.SystemRandom()  # whether a save collects; the application's random state is not touched


def _read_regular(fd: int, limit: int) -> tuple[bytes | None, str]:
    """At most ``limit`` bytes of an open file, or None and why when it is not a regular file
    or is larger than ``limit``. A file cannot make this read more than limit + 1 bytes."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        return None, f"not a regular file (mode {stat.filemode(st.st_mode)})"
    if st.st_size > limit:
        return None, f"{st.st_size} bytes, larger than the {limit}-byte cap"
    parts, got = [], 0
    while got <= limit:
        part = os.read(fd, min(limit + 1 - got, 1 << 20))
        if not part:
            break
        parts.append(part)
        got += len(part)
    if got > limit:
        return None, f"grew past the {limit}-byte cap while read"
    return b"".join(parts), ""


class Directory(_Reports):
    """Entries as files under ``path`` (default :func:`default_cache_dir`): ``v1/<namespace>/<key>.twe``,
    and ``v1/<namespace>/journal``, the namespace's keys in the order saved (docs/store.md).

    Writes are atomic: a temporary file in the namespace directory, written and fsynced, renamed
    over the final name (a reader sees no entry or the whole entry, even if the writer is killed),
    then the key is appended to the journal. A reader reads the journal from where it stopped
    last and opens only the entries it does not have: a miss in an unchanged store costs one
    ``stat``. Entries are opened without following symbolic links or blocking, and only regular
    files of at most ``_MAX_ENTRY`` bytes are read. Several processes may write at once: an
    entry's name is its content hash. When the entries under ``path`` exceed ``max_bytes``, the
    oldest written are deleted until they fill at most 90% of it; the store is listed for that
    on a save with probability 16 x entry size / ``max_bytes`` (about once per ``max_bytes``/16
    written, whoever writes it).
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *, max_bytes: int = 256 << 20) -> None:
        super().__init__()
        self.path = Path(path) if path is not None else default_cache_dir()
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.max_bytes = max_bytes
        self._health = _Health.of(f"store directory {self.path}", 0.0)

    def __repr__(self) -> str:
        return f"tripwire.store.Directory({str(self.path)!r}, max_bytes={self.max_bytes})"

    def _dir(self, namespace: str) -> Path:
        return self.path / "v1" / _check_name("namespace", namespace)

    # -- reading -----------------------------------------------------------------------------------
    def read(
        self, namespace: str, position: Any = None, known: Container[str] = ()
    ) -> tuple[list[bytes], Any]:
        """The entries saved after ``position`` and the next position (see :class:`Store`)."""
        d = self._dir(namespace)
        ident, offset = position if position is not None else ((0, 0), 0)
        try:
            st = os.stat(d / _JOURNAL, follow_symlinks=False)
        except FileNotFoundError:
            return [], position  # nothing saved yet
        except NotADirectoryError as e:
            self._bad_namespace(namespace, str(d), str(e))
            return [], position
        except OSError as e:
            self._health.failed(f"tripwire: cannot read the {self._health.name}: {e}")
            return [], position
        if (st.st_dev, st.st_ino) == ident and st.st_size == offset:
            self._health.ok()
            return [], position  # unchanged since the last read
        try:
            dfd = os.open(d, _OPEN_DIR)
        except FileNotFoundError:
            return [], position
        except OSError as e:
            self._bad_namespace(namespace, str(d), f"cannot be opened as a directory ({e})")
            return [], position
        try:
            keys, ident, offset = self._new_keys(dfd, namespace, d, ident, offset)
            out, seen = [], set()
            for key in keys:
                if key in known or key in seen:
                    continue
                seen.add(key)
                data = self._entry(dfd, namespace, d, key)
                if data is not None:
                    out.append(data)
        except OSError as e:
            self._health.failed(f"tripwire: cannot read the {self._health.name}: {e}")
            return [], position
        finally:
            os.close(dfd)
        self._health.ok()
        return out, (ident, offset)

    def _new_keys(
        self, dfd: int, namespace: str, d: Path, ident: tuple[int, int], offset: int
    ) -> tuple[list[str], tuple[int, int], int]:
        """The keys the journal gained after ``offset`` (from the start if it is another file
        now: rewritten by eviction), and where the next read starts. A record is
        ``\\n<key>\\n``: a torn record is ended by the next writer's leading newline, and a
        trailing part without its newline is read again next time unless it is too long to be
        a record."""
        try:
            jfd = os.open(_JOURNAL, _OPEN_READ, dir_fd=dfd)
        except FileNotFoundError:
            return [], ident, offset
        except OSError as e:
            self._bad_namespace(namespace, str(d), f"its journal cannot be opened ({e})")
            return [], ident, offset
        try:
            st = os.fstat(jfd)
            if not stat.S_ISREG(st.st_mode):
                self._bad_namespace(namespace, str(d), "its journal is not a regular file")
                return [], ident, offset
            if (st.st_dev, st.st_ino) != ident or st.st_size < offset:
                ident, offset = (st.st_dev, st.st_ino), 0
            keys, bad, tail = [], 0, b""
            while offset + len(tail) < st.st_size:
                chunk = os.pread(jfd, min(st.st_size - offset - len(tail), 1 << 20), offset + len(tail))
                if not chunk:
                    break
                lines = (tail + chunk).split(b"\n")
                tail = lines.pop()
                for line in lines:
                    offset += len(line) + 1
                    if _NAME_BYTES.fullmatch(line):
                        keys.append(line.decode("ascii"))
                    elif line:
                        bad += 1
                if len(tail) >= _RECORD:  # no record is that long: garbage, pass it
                    offset += len(tail)
                    tail, bad = b"", bad + 1
        finally:
            os.close(jfd)
        if bad:
            self._bad_namespace(namespace, str(d), f"its journal holds {bad} malformed records (passed over)")
        return keys, ident, offset

    def _entry(self, dfd: int, namespace: str, d: Path, key: str) -> bytes | None:
        """One entry's bytes, or None (reported) when it cannot be served."""
        where = str(d / f"{key}.twe")
        try:
            fd = os.open(f"{key}.twe", _OPEN_READ, dir_fd=dfd)
        except FileNotFoundError:
            return None  # evicted meanwhile
        except OSError as e:
            why = "a symbolic link" if e.errno == errno.ELOOP else f"cannot be opened ({e})"
            self._skip(namespace, key, where, why)
            return None
        try:
            data, why = _read_regular(fd, _MAX_ENTRY)
        finally:
            os.close(fd)
        if data is not None:
            try:
                decode_entry(data)
                if entry_key(data) != key:
                    raise FormatError("its content does not hash to its name")
            except FormatError as e:
                data, why = None, str(e)
        if data is None:
            self._skip(namespace, key, where, why)
        return data

    # -- writing -----------------------------------------------------------------------------------
    def save(self, namespace: str, key: str, data: bytes) -> None:
        """Write one entry (atomically; a corrupt file under its name is replaced) and append its
        key to the namespace's journal."""
        d = self._dir(namespace)
        _check_entry(_check_name("key", key), data)
        try:
            try:
                dfd = self._open_namespace(d)
            except FileNotFoundError:
                (self.path / "v1").mkdir(parents=True, exist_ok=True)
                with contextlib.suppress(FileExistsError):
                    os.mkdir(d)
                dfd = self._open_namespace(d)
            if dfd < 0:
                self._bad_namespace(namespace, str(d), "it is not a directory")
                return
            try:
                try:
                    self._write(dfd, f"{key}.twe", data)
                except IsADirectoryError:  # a directory holds the entry's name: not an outage
                    self._skip(namespace, key, str(d / f"{key}.twe"), "a directory holds its name")
                    return
                self._append(dfd, namespace, d, key)
            finally:
                os.close(dfd)
        except OSError as e:
            self._health.failed(f"tripwire: cannot write to the {self._health.name}: {e}")
            return
        self._health.ok()
        if _CHANCE.random() * self.max_bytes < 16 * len(data):
            self._collect()

    @staticmethod
    def _open_namespace(d: Path) -> int:
        """The namespace directory's descriptor; -1 if it is a link or not a directory."""
        try:
            return os.open(d, _OPEN_DIR)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                return -1
            raise

    def _write(self, dfd: int, name: str, data: bytes) -> None:
        """``data`` under ``name``, atomically: written to a temporary file and fsynced before the
        rename that publishes it, so no crash or kill leaves a torn entry under a final name.
        The rename replaces whatever held the name (a corrupt entry, a link, a FIFO)."""
        tmp = f".tmp-{secrets.token_hex(8)}.part"
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd
        )
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise

    def _append(self, dfd: int, namespace: str, d: Path, key: str) -> None:
        """Append the key's record to the journal (one O_APPEND write: records of concurrent
        writers do not interleave). A journal that is not a regular file is replaced by an empty
        one first (its entries are then found again as they are saved again)."""
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(_JOURNAL, flags, 0o600, dir_fd=dfd)
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.EWOULDBLOCK):
                raise
            fd = -1
        if fd >= 0 and not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            fd = -1
        if fd < 0:
            try:
                self._write(dfd, _JOURNAL, b"")
                fd = os.open(_JOURNAL, flags, 0o600, dir_fd=dfd)
            except OSError as e:
                self._bad_namespace(namespace, str(d), f"its journal is not a regular file ({e})")
                return
            self._bad_namespace(namespace, str(d), "its journal was not a regular file; replaced")
        try:
            os.write(fd, b"\n" + key.encode() + b"\n")
        finally:
            os.close(fd)

    # -- eviction ----------------------------------------------------------------------------------
    def _listing(self) -> tuple[list[tuple[Path, int, int]], list[tuple[Path, int]], dict[Path, int]]:
        """(entries as (path, size, mtime_ns), temporary files as (path, mtime_ns), journal
        sizes by namespace directory), listed without following links."""
        entries, temps, journals = [], [], {}
        root = self.path / "v1"
        try:
            namespaces = list(os.scandir(root))
        except FileNotFoundError:
            return [], [], {}
        for ns in namespaces:
            if not (_NAME.fullmatch(ns.name) and ns.is_dir(follow_symlinks=False)):
                continue
            try:
                files = list(os.scandir(ns.path))
            except OSError:
                continue
            for f in files:
                try:
                    if not f.is_file(follow_symlinks=False):
                        continue
                    st = f.stat(follow_symlinks=False)
                except OSError:
                    continue
                if f.name.endswith(".twe") and _NAME.fullmatch(f.name[:-4]):
                    entries.append((Path(f.path), st.st_size, st.st_mtime_ns))
                elif f.name.startswith(".tmp-") and f.name.endswith(".part"):
                    temps.append((Path(f.path), st.st_mtime_ns))
                elif f.name == _JOURNAL:
                    journals[Path(ns.path)] = st.st_size
        entries.sort(key=lambda e: e[2])
        return entries, temps, journals

    def entries(self) -> list[tuple[Path, int, float]]:
        """Every entry file: (path, size, mtime in seconds), oldest first."""
        return [(p, size, mtime / 1e9) for p, size, mtime in self._listing()[0]]

    def _collect(self) -> None:
        """Evict the oldest entries down to 90% of ``max_bytes`` when the store exceeds it,
        remove killed writers' temporary files once an hour old, and rewrite journals that hold
        mostly records of deleted entries. Problems here are never the caller's."""
        try:
            entries, temps, journals = self._listing()
            now = time.time_ns()
            for path, mtime in temps:
                if now - mtime > _TEMP_MAX_AGE * 10**9:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
            total = sum(size for _, size, _ in entries)
            live: list[tuple[Path, int, int]] = []
            if total > self.max_bytes:
                target = self.max_bytes * 9 // 10
                for i, (path, size, _) in enumerate(entries):
                    if total <= target:
                        live = entries[i:]
                        break
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                    total -= size
                log.info("tripwire: store %s evicted down to %d bytes", self.path, total)
            else:
                live = entries
            by_ns: dict[Path, list[str]] = {d: [] for d in journals}
            for path, _, _ in live:
                by_ns.setdefault(path.parent, []).append(path.name[:-4])
            for d, size in journals.items():
                if size > 2 * _RECORD * len(by_ns[d]) + 4096:
                    self._rewrite_journal(d, by_ns[d])
        except OSError as e:
            log.info("tripwire: store %s: eviction stopped: %s", self.path, e)

    def _rewrite_journal(self, d: Path, keys: list[str]) -> None:
        """Replace the journal by one record per live entry. A writer that saved an entry after
        ``keys`` was listed may have appended its record to the journal being replaced, so the
        directory is listed again after the rename and any entry missing from ``keys`` gets a
        record in the new journal: an entry published before that second listing is in it, and
        one published after opens the new journal itself. No saved entry loses its record."""
        dfd = os.open(d, _OPEN_DIR)
        try:
            self._write(dfd, _JOURNAL, b"".join(b"\n" + k.encode() + b"\n" for k in keys))
            listed = set(keys)
            with os.scandir(dfd) as it:
                late = [
                    f.name[:-4]
                    for f in it
                    if f.name.endswith(".twe")
                    and _NAME_BYTES.fullmatch(f.name[:-4].encode())
                    and f.name[:-4] not in listed
                ]
            for key in late:
                self._append(dfd, d.name, d, key)
        finally:
            os.close(dfd)


class Redis(_Reports):
    """Entries in a Redis server (redis-py), for a fleet of machines: ``<prefix>:v1:<namespace>``
    is a stream whose records name the namespace's keys in the order saved (field ``k``),
    ``<prefix>:v1:<namespace>:<key>`` an entry. A reader asks only for the records after the
    last one it read (``XRANGE``), and fetches only the entries it does not have. ``ttl``
    (seconds) expires entries and the stream; the server's ``maxmemory`` policy may also evict
    entries (a record whose entry is gone is deleted from the stream).

    When the server cannot be reached (down at start, or stopping mid-run), loads return nothing
    and saves are kept in memory (up to ``pending_limit`` entries), with one
    :class:`StoreWarning` per outage and one line when it is back; after a failure the server
    is not tried again for ``retry_after`` seconds, so calls do not wait on it. A namespace key
    of another Redis type is reported once and its entries are not written.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "tripwire",
        ttl: int | None = None,
        timeout: float = 1.0,
        retry_after: float = 5.0,
        pending_limit: int = 1024,
        client: Any = None,
    ) -> None:
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError:
            raise ImportError("tripwire.store.Redis needs redis-py: pip install redis") from None

        super().__init__()
        self.url = url
        self.prefix = prefix
        self.ttl = ttl
        self.pending_limit = pending_limit
        # The server's answers to a command it refused (WRONGTYPE, OOM, READONLY) are not an
        # outage; everything else redis-py raises is.
        self._refused = redis.exceptions.ResponseError
        self._errors = (redis.exceptions.RedisError, OSError)
        self._client = client or redis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0)
        )
        self._health = _Health.of(f"Redis store {url}", retry_after)
        self._pending: list[tuple[str, str, bytes]] = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"tripwire.store.Redis({self.url!r}, prefix={self.prefix!r})"

    def _index_key(self, namespace: str) -> str:
        return f"{self.prefix}:v1:{_check_name('namespace', namespace)}"

    def entry_key(self, namespace: str, key: str) -> str:
        """The Redis key of one entry (``python -m tripwire inspect redis://host:port/<this>``)."""
        return f"{self._index_key(namespace)}:{_check_name('key', key)}"

    def _down(self, what: str, e: BaseException) -> None:
        self._health.failed(
            f"tripwire: Redis store {self.url} unavailable while {what} ({type(e).__name__}: {e}); "
            f"compiling locally, unsaved entries are kept and written when it is back (next try "
            f"in {self._health.retry_after:g} s)"
        )

    def _up(self, written: int) -> None:
        self._health.ok(f"; {written} kept entries written" if written else "")

    def _refusal(self, namespace: str, e: Exception) -> None:
        self._bad_namespace(namespace, self._index_key(namespace), f"the server refused: {e}")

    def _flush(self) -> int:
        """Write the entries kept while the server was down; how many were written."""
        with self._lock:
            pending, self._pending = self._pending, []
        for i, (ns, key, data) in enumerate(pending):
            try:
                self._write(ns, key, data)
            except self._refused as e:
                self._refusal(ns, e)
            except self._errors:
                with self._lock:
                    self._pending[:0] = pending[i:]
                raise
        return len(pending)

    def _write(self, namespace: str, key: str, data: bytes) -> None:
        index, entry = self._index_key(namespace), self.entry_key(namespace, key)
        pipe = self._client.pipeline(transaction=False)
        pipe.set(entry, data, ex=self.ttl)
        pipe.xadd(index, {"k": key}, maxlen=_INDEX_LIMIT, approximate=True)
        if self.ttl:
            pipe.expire(index, self.ttl)
        results = pipe.execute(raise_on_error=False)
        for r in results:
            if isinstance(r, self._errors) and not isinstance(r, self._refused):
                raise r
        if isinstance(results[1], self._refused):
            # The index is not a stream (another type under its name): the entry could never be
            # found, so it is not left behind.
            self._client.delete(entry)
            raise results[1]
        if isinstance(results[0], self._refused):
            raise results[0]

    def save(self, namespace: str, key: str, data: bytes) -> None:
        """Write one entry and its index record; kept in memory while the server is down."""
        self.entry_key(namespace, key)
        _check_entry(key, data)
        if self._health.available():
            try:
                written = self._flush()
                self._write(namespace, key, data)
            except self._refused as e:
                self._refusal(namespace, e)
                return
            except self._errors as e:
                failure: BaseException | None = e
            else:
                self._up(written)
                return
        else:
            failure = None  # backing off: the server is not tried
        with self._lock:
            if len(self._pending) < self.pending_limit:
                self._pending.append((namespace, key, data))
        if failure is not None:
            self._down("saving", failure)

    def read(
        self, namespace: str, position: Any = None, known: Container[str] = ()
    ) -> tuple[list[bytes], Any]:
        """The entries saved after ``position`` and the next position (see :class:`Store`)."""
        index = self._index_key(namespace)
        if not self._health.available():
            return [], position
        try:
            written = self._flush()
            records: list[Any] = []
            start = b"-" if position is None else b"(" + position
            while True:
                batch: Any = self._client.xrange(index, min=start, max="+", count=_INDEX_BATCH)
                records += batch
                if len(batch) < _INDEX_BATCH:
                    break
                start = b"(" + batch[-1][0]
            wanted: dict[str, bytes] = {}
            bad = 0
            for rid, fields in records:
                k = fields.get(b"k") if isinstance(fields, dict) else None
                if not (isinstance(k, bytes) and _NAME_BYTES.fullmatch(k)):
                    bad += 1
                    continue
                key = k.decode("ascii")
                if key not in known and key not in wanted:
                    wanted[key] = rid
            pipe = self._client.pipeline(transaction=False)
            for key in wanted:
                pipe.getrange(self.entry_key(namespace, key), 0, _MAX_ENTRY)
            values = pipe.execute(raise_on_error=False) if wanted else []
            for v in values:
                if isinstance(v, self._errors) and not isinstance(v, self._refused):
                    raise v
            gone = [rid for (key, rid), v in zip(wanted.items(), values, strict=True) if v == b""]
            if gone:
                self._client.xdel(index, *gone)
        except self._refused as e:
            self._refusal(namespace, e)
            return [], position
        except self._errors as e:
            self._down("loading", e)
            return [], position
        self._up(written)
        if bad:
            self._bad_namespace(namespace, index, f"{bad} malformed index records (passed over)")
        out = []
        for key, v in zip(wanted, values, strict=True):
            where = f"{self.url} {self.entry_key(namespace, key)}"
            if isinstance(v, Exception):
                self._skip(namespace, key, where, f"the server refused it: {v}")
                continue
            if v == b"":
                continue  # expired or evicted
            try:
                if len(v) > _MAX_ENTRY:
                    raise FormatError(f"larger than the {_MAX_ENTRY}-byte cap")
                decode_entry(v)
                if entry_key(v) != key:
                    raise FormatError("its content does not hash to its name")
            except FormatError as e:
                self._skip(namespace, key, where, str(e))
                continue
            out.append(bytes(v))
        return out, records[-1][0] if records else position

    @property
    def pending(self) -> int:
        """Entries waiting for the server."""
        return len(self._pending)


_INDEX_LIMIT = 1 << 16  # records kept per namespace stream (XADD MAXLEN ~)
_INDEX_BATCH = 1024  # records per XRANGE


def entry_key(data: bytes) -> str:
    """An entry's name: the hash of its bytes (the same entry, the same name, from any writer)."""
    return hashlib.sha256(data).hexdigest()[:32]


def namespace_of(parts: Iterable[str]) -> str:
    """A namespace: the hash of what must match for entries to be shared (function, code,
    backend, codec, Python version, format version)."""
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).hexdigest()[:32]
