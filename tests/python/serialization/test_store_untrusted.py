"""Stored bytes are untrusted: whatever a store holds is served correctly or skipped with one report,
nothing else reaches the caller and nothing hangs (docs/store.md, "Untrusted stores"). Entries here
carry valid content hashes, so they reach every check past the hash."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import serial_fixtures as fx
import tripwire as tw
from gc_stress import examples
from redis_server import RedisServer, free_port, redis_server_fixture  # noqa: F401 (a fixture)
from tripwire.store import (
    _MAX_ENTRY,
    Directory,
    Redis,
    ReferenceCodec,
    StoreWarning,
    decode_entry,
    entry_key,
    namespace_of,
)

_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def fast_helper(x: Any) -> Any:
    """What the compiler returns for serial_fixtures.helper: the same answers."""
    return x * 2


COMPILES: list[Any] = []


def compile_helper(fn: Any, args: Any, builder: Any) -> Any:
    COMPILES.append(args["x"])
    return fast_helper


def specialized(store: Any) -> Any:
    return tw.specialize(
        fx.helper, compiler=compile_helper, store=store, recompile_limit=1024, accumulated_limit=1024
    )


def raw_entry(guards: bytes, codec: bytes, payload: bytes, *, version: int = 1, flags: int = 0) -> bytes:
    """An entry laid out as docs/store.md says, its content hash valid whatever the parts hold."""
    rest = guards + codec + payload
    head = struct.pack(
        "<8sHHIII32s",
        b"\x89TWE\r\n\x1a\n",
        version,
        flags,
        len(guards),
        len(codec),
        len(payload),
        hashlib.sha256(rest).digest(),
    )
    return head + rest


@functools.cache
def genuine() -> dict[str, Any]:
    """Real guard bytes for x == 1 and x == 2, and the payload that names fast_helper."""
    with tempfile.TemporaryDirectory() as d:
        f = specialized(Directory(d))
        f(1)
        f(2)
        entries = [decode_entry(b) for b in Directory(d).load(f._namespace())]
    by_x = {}
    for e in entries:
        gs = tw.GuardSet.from_bytes(e.guards)
        by_x[1 if gs.check({"x": 1}) else 2] = e.guards
    payload = ReferenceCodec(modules=[__name__]).encode(fast_helper)
    return {"guards": by_x, "payload": payload}


# -- hostile entries ---------------------------------------------------------------------------------

_FIELDS = ("kind", "module", "qualname", "fingerprint")
_HOSTILE_VALUES = st.one_of(
    st.integers(-(2**70), 2**70),
    st.text(max_size=20),
    st.none(),
    st.booleans(),
    st.floats(allow_nan=True),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@st.composite
def payloads(draw: Any) -> bytes:
    good = json.loads(genuine()["payload"])
    choice = draw(st.integers(0, 9))
    if choice == 0:
        return bytes(genuine()["payload"])
    if choice == 1:  # one field of the wrong type or value ("qualname": 123)
        ref = dict(good)
        ref[draw(st.sampled_from(_FIELDS))] = draw(_HOSTILE_VALUES)
        return json.dumps(ref).encode()
    if choice == 2:  # a field missing, or extra ones
        ref = dict(good)
        del ref[draw(st.sampled_from(_FIELDS))]
        return json.dumps(ref).encode()
    if choice == 3:  # nested 100,000 deep
        opener = draw(st.sampled_from([b"[", b'{"a":']))
        return opener * 100_000
    if choice == 4:  # a function outside the admitted modules, with its own valid fingerprint
        return ReferenceCodec(modules=["json"]).encode(json.dumps)
    if choice == 5:  # not UTF-8
        return b"\xff\xfe" + draw(st.binary(max_size=20))
    if choice == 6:  # a real function outside the admitted modules
        return json.dumps(dict(good, module="os", qualname="getpid")).encode()
    if choice == 7:
        return draw(st.sampled_from([b"", b"null", b"[]", b"1e999999", b'"' + b"a" * 100_000 + b'"']))
    if choice == 8:  # a large but flat document
        return json.dumps(dict(good, extra=["x"] * 20_000)).encode()
    return draw(st.binary(max_size=64))


@st.composite
def guard_bytes(draw: Any) -> bytes:
    valid = genuine()["guards"][draw(st.sampled_from([1, 2]))]
    choice = draw(st.integers(0, 4))
    if choice == 0:
        return bytes(valid)
    if choice == 1:  # truncated
        return bytes(valid[: draw(st.integers(0, len(valid) - 1))])
    if choice == 2:  # one byte changed (the guard format's own checksum, then its decoder)
        i = draw(st.integers(0, len(valid) - 1))
        return valid[:i] + bytes([valid[i] ^ draw(st.integers(1, 255))]) + valid[i + 1 :]
    if choice == 3:
        return draw(st.binary(max_size=80))
    return valid + draw(st.binary(min_size=1, max_size=8))  # trailing bytes


@st.composite
def hostile_entries(draw: Any) -> bytes:
    codec = draw(
        st.sampled_from([b"reference", b"tripwire:function", b"bytes", b"\xff\xfe", b"", b"x" * 300])
    )
    payload = b"" if codec == b"tripwire:function" and draw(st.booleans()) else draw(payloads())
    version, flags = draw(st.sampled_from([(1, 0), (1, 0), (1, 0), (2, 0), (1, 4)]))
    return raw_entry(draw(guard_bytes()), codec, payload, version=version, flags=flags)


@st.composite
def cases(draw: Any) -> tuple[list[bytes], bool, bool]:
    """Hostile entries, whether one is stored under a name that is not its hash, and whether
    the namespace's index gets a malformed record (not hex, not UTF-8)."""
    return (
        draw(st.lists(hostile_entries(), min_size=1, max_size=3)),
        draw(st.booleans()),
        draw(st.booleans()),
    )


def check_case(
    make_store: Callable[[], Any],
    plant: Callable[[str, str, bytes], None],
    plant_record: Callable[[str, bytes], None],
    case: tuple[list[bytes], bool, bool],
) -> None:
    hostile, misnamed, bad_record = case
    a = specialized(make_store())
    a(1)  # another process compiled and stored x == 1
    ns = a._namespace()
    names = set(a._store_keys)  # the genuine entry's
    for i, data in enumerate(hostile):
        key = entry_key(data)
        if misnamed and i == 0:
            key = entry_key(data + b"elsewhere")
        plant(ns, key, data)
        names.add(key)
    if bad_record:
        plant_record(ns, b"\xff\xfe../../etc/passwd" + b"0" * 14)
    store = make_store()
    b = specialized(store)
    COMPILES.clear()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        results = [b(1), b(2), b(3), b(1), b(2), b(3)]
    assert results == [2, 4, 6, 2, 4, 6]
    assert 1 not in COMPILES  # the genuine entry is served whatever else the store holds
    assert sorted(COMPILES) == sorted(set(COMPILES))  # at most one compile per miss
    reports = [str(x.message) for x in w if issubclass(x.category, StoreWarning)]
    assert len(reports) == len(w)
    skipped = len(store.skipped) + len(b.store_skipped)
    assert b.store_loads + skipped == len(names), (reports, b.store_loads)  # each name once
    namespace_reports = [r for r in reports if "namespace" in r]
    assert len(namespace_reports) == int(bad_record)
    assert len(reports) == skipped + len(namespace_reports)  # one report per skipped entry
    # The default compiler's entries and codec-decoded payloads both end as fx.helper's answers.
    assert all("Traceback" not in r for r in reports)


@settings(max_examples=examples(60), **_SETTINGS)  # type: ignore[arg-type]
@given(cases())
def test_hostile_entries_in_a_directory(case: tuple[list[bytes], bool, bool]) -> None:
    with tempfile.TemporaryDirectory() as root:

        def plant(ns: str, key: str, data: bytes) -> None:
            d = Path(root) / "v1" / ns
            (d / f"{key}.twe").write_bytes(data)
            plant_record(ns, key.encode())

        def plant_record(ns: str, record: bytes) -> None:
            with open(Path(root) / "v1" / ns / "journal", "ab") as j:
                j.write(b"\n" + record + b"\n")

        check_case(lambda: Directory(root), plant, plant_record, case)


def test_hostile_entries_in_redis(redis_server: RedisServer) -> None:
    import redis

    client = redis.Redis.from_url(redis_server.url)
    n = iter(range(1_000_000))

    @settings(max_examples=examples(40), **_SETTINGS)  # type: ignore[arg-type]
    @given(cases())
    def run(case: tuple[list[bytes], bool, bool]) -> None:
        prefix = f"t{next(n)}"

        def plant(ns: str, key: str, data: bytes) -> None:
            client.set(f"{prefix}:v1:{ns}:{key}", data)
            plant_record(ns, key.encode())

        def plant_record(ns: str, record: bytes) -> None:
            client.xadd(f"{prefix}:v1:{ns}", {"k": record})

        check_case(lambda: Redis(redis_server.url, prefix=prefix), plant, plant_record, case)

    run()


# -- files that are not entries ------------------------------------------------------------------------


def planted(root: Path, f: Any) -> tuple[Path, str, Path]:
    """The namespace directory of ``f`` with a journal record for a key whose file the test
    makes; (directory, key, entry path)."""
    ns = f._namespace()
    d = root / "v1" / ns
    d.mkdir(parents=True, exist_ok=True)
    key = entry_key(b"planted")
    with open(d / "journal", "ab") as j:
        j.write(b"\n" + key.encode() + b"\n")
    return d, key, d / f"{key}.twe"


def served_with_one_report(root: Path, f: Any, match: str) -> None:
    COMPILES.clear()
    done: list[Any] = []

    def call() -> None:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            done.append([f(1), f(1), f(2)])
        done.append([str(x.message) for x in w])

    t = threading.Thread(target=call, daemon=True)  # a blocked open would hang here, not the suite
    t.start()
    t.join(timeout=60)
    assert not t.is_alive(), "the load blocked"
    assert done[0] == [2, 2, 4] and COMPILES == [1, 2]
    assert len(done[1]) == 1 and match in done[1][0], done[1]


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda p: os.symlink("/dev/zero", p), "symbolic link"),
        (lambda p: os.symlink("/etc/passwd", p), "symbolic link"),
        (lambda p: os.mkfifo(p), "not a regular file"),
        (lambda p: os.mknod(p, 0o600 | stat.S_IFCHR, os.makedev(1, 5)), "not a regular file"),  # /dev/zero
        (lambda p: os.mkdir(p), "not a regular file"),
        (lambda p: (p.write_bytes(b""), os.truncate(p, _MAX_ENTRY + 1)), "cap"),  # sparse, never read
    ],
    ids=["symlink-dev-zero", "symlink-file", "fifo", "device", "directory", "oversize"],
)
def test_special_files_are_skipped_unread(tmp_path: Path, make: Any, match: str) -> None:
    f = specialized(Directory(tmp_path))
    _, _, path = planted(tmp_path, f)
    make(path)
    served_with_one_report(tmp_path, f, match)


def test_a_fifo_or_link_as_journal_or_namespace_does_not_block_and_heals(tmp_path: Path) -> None:
    f = specialized(Directory(tmp_path))
    d = tmp_path / "v1" / f._namespace()
    d.mkdir(parents=True)
    os.mkfifo(d / "journal")
    served_with_one_report(tmp_path, f, "journal")
    assert stat.S_ISREG(os.lstat(d / "journal").st_mode)  # the save replaced it
    g = specialized(Directory(tmp_path))
    COMPILES.clear()
    assert g(1) == 2 and g(2) == 4 and COMPILES == [] and g.store_loads == 2
    # A namespace directory that is a link elsewhere is neither read nor written through.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root2 = tmp_path / "two"
    f2 = specialized(Directory(root2))
    (root2 / "v1").mkdir(parents=True)
    os.symlink(elsewhere, root2 / "v1" / f2._namespace())
    served_with_one_report(root2, f2, "namespace")
    assert list(elsewhere.iterdir()) == []


def test_names_with_separators_or_dots_are_refused(tmp_path: Path, redis_server: RedisServer) -> None:
    good_ns, blob = namespace_of(["x"]), b"x"
    for store in (Directory(tmp_path / "s"), Redis(redis_server.url)):
        for bad in ["..", "../" + "0" * 29, "a/b", "0" * 31 + "/", "0" * 32 + "\0", "0" * 31 + "A", "", 7]:
            with pytest.raises(ValueError, match="32 lowercase hex"):
                store.save(bad, entry_key(blob), blob)  # type: ignore[arg-type]
            with pytest.raises(ValueError, match="32 lowercase hex"):
                store.save(good_ns, bad, blob)  # type: ignore[arg-type]
            with pytest.raises(ValueError, match="32 lowercase hex"):
                store.load(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="entry_key"):
            store.save(good_ns, "0" * 32, blob)
    assert not (tmp_path / "s").exists() or list((tmp_path / "s").rglob("*.twe")) == []


def test_a_corrupt_file_under_an_entry_name_is_replaced(tmp_path: Path) -> None:
    """The recompiled entry has the corrupt one's name (the same call compiles the same bytes):
    its save replaces the file, and the next process loads it."""
    good = b""
    for i in range(3):
        f = specialized(Directory(tmp_path))
        COMPILES.clear()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            assert f(1) == 2  # one call site for the three "processes"
        (path,) = (tmp_path / "v1" / f._namespace()).glob("*.twe")
        if i == 0:
            good = path.read_bytes()
            path.write_bytes(good[:-3] + b"bad")  # the same name, corrupt content
        elif i == 1:
            assert COMPILES == [1] and len(w) == 1 and "hash" in str(w[0].message)
            assert path.read_bytes() == good  # the recompiled entry replaced it
        else:
            assert COMPILES == [] and w == [] and f.store_loads == 1


def test_killed_writers_leave_nothing_that_slows_or_misleads(tmp_path: Path) -> None:
    """Stale temporary files (a writer killed mid-write), records without entries (killed
    between the rename and ... or evicted) are never read; a later writer's collection removes
    temporary files once an hour old and keeps younger ones (a live writer's)."""
    f = specialized(Directory(tmp_path, max_bytes=1))  # every save collects
    d = tmp_path / "v1" / f._namespace()
    d.mkdir(parents=True)
    for i in range(50):
        (d / f".tmp-{i:04x}.part").write_bytes(b"\x89TWE half")
        if i % 2:
            os.utime(d / f".tmp-{i:04x}.part", (1, 1))
    with open(d / "journal", "ab") as j:
        j.write(b"\n" + entry_key(b"gone").encode() + b"\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert f(1) == 2
    assert len(list(d.glob(".tmp-*.part"))) == 25  # the old ones went, the young ones stayed


def test_the_journal_is_read_from_where_the_reader_stopped(tmp_path: Path, monkeypatch: Any) -> None:
    """A miss reads only the entries saved since the last read: a store of N entries costs one
    entry read per new entry, not N per miss."""
    store = Directory(tmp_path)
    f = specialized(store)
    for x in range(20):
        f(x)
    reads: list[str] = []
    real = Directory._entry
    mine = Directory(tmp_path)

    def counting(self: Any, dfd: int, namespace: str, d: Path, key: str) -> Any:
        if self is mine:
            reads.append(key)
        return real(self, dfd, namespace, d, key)

    monkeypatch.setattr(Directory, "_entry", counting)
    g = specialized(mine)
    assert g(0) == 0 and len(reads) == 20  # a new reader reads each entry once
    for x in range(20, 30):
        g(x)  # each miss compiles and saves; its own entry is never read back
    assert len(reads) == 20
    f(100)  # another writer
    assert g(100) == 200 and len(reads) == 21 and g.store_loads == 21


# -- Redis: wrong types, non-UTF-8 records, outages ------------------------------------------------------


def test_a_redis_namespace_of_another_type(redis_server: RedisServer) -> None:
    import redis

    client = redis.Redis.from_url(redis_server.url)
    store = Redis(redis_server.url)
    f = specialized(store)
    index = f"tripwire:v1:{f._namespace()}"
    for kind in ("string", "set", "hash"):
        client.delete(index)
        {
            "string": lambda: client.set(index, b"x"),
            "set": lambda: client.sadd(index, b"x"),
            "hash": lambda: client.hset(index, "a", "b"),
        }[kind]()
        f = specialized(Redis(redis_server.url))
        COMPILES.clear()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            assert [f(1), f(2), f(1), f(3)] == [2, 4, 2, 6]
        assert COMPILES == [1, 2, 3] and f.store.pending == 0
        assert len(w) == 1 and "namespace" in str(w[0].message) and "WRONGTYPE" in str(w[0].message)
        assert "unavailable" not in str(w[0].message)
        assert client.keys("tripwire:v1:*:*") == []  # no entry key left without its index


def test_a_non_utf8_index_member_is_skipped(redis_server: RedisServer) -> None:
    import redis

    client = redis.Redis.from_url(redis_server.url)
    f = specialized(Redis(redis_server.url))
    f(1)
    index = f"tripwire:v1:{f._namespace()}"
    for record in [b"\xff" * 32, b"\xc3(" * 16, b"", "\u00e9".encode() * 16]:
        client.xadd(index, {"k": record})
    client.xadd(index, {"other": b"x"})
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        f(2)  # f reads the records too
    assert len(w) == 1
    g = specialized(Redis(redis_server.url))
    COMPILES.clear()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert g(1) == 2 and g(2) == 4 and g(3) == 6
    assert COMPILES == [3] and g.store_loads == 2
    assert len(w) == 1 and "5 malformed index records" in str(w[0].message)


class _DownClient:
    """A Redis client whose server is down: counts the attempts."""

    def __init__(self) -> None:
        self.attempts = 0

    def __getattr__(self, name: str) -> Any:
        def fail(*a: Any, **k: Any) -> Any:
            self.attempts += 1
            raise ConnectionRefusedError(111, "Connection refused")

        return fail


def test_an_outage_warns_once_and_backs_off() -> None:
    pytest.importorskip("redis")
    client = _DownClient()
    store = Redis(f"redis://127.0.0.1:{free_port()}/9", client=client, retry_after=60)
    f = specialized(store)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert [f(x) for x in range(20)] == [2 * x for x in range(20)]
    assert len(w) == 1 and "unavailable" in str(w[0].message)
    assert client.attempts == 1  # the server is not tried again during the back-off
    assert store.pending == 20


def test_redis_down_then_back_twenty_calls_one_warning_one_line(
    redis_server: RedisServer, caplog: Any
) -> None:
    store = Redis(redis_server.url, timeout=0.2, retry_after=0.3)
    f = specialized(store)
    f(0)
    redis_server.stop()
    caplog.set_level(logging.INFO, logger="tripwire.store")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for x in range(1, 21):
            assert f(x) == 2 * x
            time.sleep(0.02)
    assert len(w) == 1 and "unavailable" in str(w[0].message)
    redis_server.start()
    time.sleep(0.35)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for x in range(21, 41):
            assert f(x) == 2 * x
    assert len(w) == 1 and "available again" in str(w[0].message)
    # The log records are INFO (never printed by logging's last-resort handler): two messages.
    assert [r.levelno for r in caplog.records if r.name == "tripwire.store"] == [logging.INFO, logging.INFO]
    assert store.pending == 0


_DOWN_APP = """
import sys
sys.path.insert(0, {here!r} + "/../support")
import tripwire as tw
from tripwire.store import Redis
import serial_fixtures as fx
f = tw.specialize(fx.helper, store=Redis("redis://127.0.0.1:{port}/0", timeout=0.2), recompile_limit=100)
print(sum(f(x) for x in range(22)))
"""


def test_a_default_user_sees_an_outage_once() -> None:
    pytest.importorskip("redis")
    out = subprocess.run(
        [sys.executable, "-c", _DOWN_APP.format(here=str(Path(__file__).parent), port=free_port())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and out.stdout.strip() == str(sum(2 * x for x in range(22)))
    assert out.stderr.count("StoreWarning") == 1 and out.stderr.count("unavailable") == 1, out.stderr


# -- the boundary: user codecs and stores, re-entrancy ---------------------------------------------


class _Codec:
    """A codec of the user's own whose decode does what the test says."""

    name = "mine"

    def __init__(self, decode: Callable[[bytes], Any]) -> None:
        self._decode = decode

    def encode(self, payload: Any) -> bytes:
        return b"fast"

    def decode(self, data: bytes) -> Any:
        return self._decode(data)


def _stored_then(tmp_path: Path, decode: Callable[[bytes], Any]) -> Any:
    """A function whose store holds its entry for x == 1, and whose codec decodes with ``decode``."""
    first = tw.specialize(
        fx.helper, compiler=compile_helper, store=Directory(tmp_path), codec=_Codec(lambda d: fast_helper)
    )
    first(1)
    return tw.specialize(fx.helper, compiler=compile_helper, store=Directory(tmp_path), codec=_Codec(decode))


def test_a_decode_that_calls_the_function_runs_it_uncompiled(tmp_path: Path) -> None:
    """A finalizer, weakref callback or codec calling the function while an entry loads (the
    function's lock is held by this thread) runs the function itself instead of deadlocking."""
    inner: list[Any] = []

    def decode(data: bytes) -> Any:
        inner.append(f(5))
        return fast_helper

    f = _stored_then(tmp_path, decode)
    COMPILES.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert f(1) == 2
    assert inner == [10] and COMPILES == [] and f.store_loads == 1


@pytest.mark.parametrize(
    "make",
    [
        lambda: AttributeError("qualname"),
        lambda: RecursionError("deep"),
        MemoryError,
        lambda: TypeError("x"),
        lambda: UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"),
    ],
    ids=["AttributeError", "RecursionError", "MemoryError", "TypeError", "UnicodeDecodeError"],
)
def test_any_exception_from_one_entry_skips_it(tmp_path: Path, make: Callable[[], Exception]) -> None:
    error = make()  # a fresh one per test: a raised exception holds its frames

    def decode(data: bytes) -> Any:
        raise error

    f = _stored_then(tmp_path, decode)
    COMPILES.clear()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert f(1) == 2 and f(1) == 2
    assert COMPILES == [1] and len(w) == 1 and type(error).__name__ in str(w[0].message)
    assert len(f.store_skipped) == 1


@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit])
def test_the_process_s_own_exceptions_propagate(tmp_path: Path, error: type[BaseException]) -> None:
    def decode(data: bytes) -> Any:
        raise error

    f = _stored_then(tmp_path, decode)
    with pytest.raises(error):
        f(1)


class _BrokenStore:
    def read(self, namespace: str, position: Any = None, known: Any = ()) -> Any:
        raise OSError("my store is broken")

    def save(self, namespace: str, key: str, data: bytes) -> None:
        raise RuntimeError("cannot save either")


def test_a_store_of_the_user_s_own_that_raises() -> None:
    f = specialized(_BrokenStore())
    COMPILES.clear()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert [f(1), f(2), f(1)] == [2, 4, 2]
    assert COMPILES == [1, 2]
    assert sorted(str(x.message).split(": ")[2] for x in w) == [
        "entry kept in memory only, not stored",
        "the store could not be read",
    ]


def replaceable(x: Any) -> Any:
    return x * 2


def test_a_replaced_code_reads_its_own_namespace(tmp_path: Path) -> None:
    """fn.__code__ replaced: another namespace, read from its start; the old code's entries are
    found again when it is restored."""
    original = replaceable.__code__
    f = tw.specialize(replaceable, compiler=compile_helper, store=Directory(tmp_path))
    try:
        COMPILES.clear()
        assert f(1) == 2
        first = f._store_namespace
        replaceable.__code__ = (lambda x: x * 2).__code__
        assert f(1) == 2 and f._store_namespace != first
        replaceable.__code__ = original
        assert f(1) == 2 and f._store_namespace == first
        assert COMPILES == [1, 1] and f.store_loads == 1  # the restored code's entry came back
    finally:
        replaceable.__code__ = original
    assert len(list((tmp_path / "v1").iterdir())) == 2  # one namespace per code


def test_a_directory_under_an_entry_name_is_reported_once_not_an_outage(tmp_path: Path) -> None:
    d, blob = Directory(tmp_path), encode_entry_for(7)
    ns, key = namespace_of(["dir"]), entry_key(blob)
    (tmp_path / "v1" / ns / f"{key}.twe" / "inside").mkdir(parents=True)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        d.save(ns, key, blob)
        d.save(ns, key, blob)
        assert d.load(ns) == []
    assert len(w) == 1 and "a directory holds its name" in str(w[0].message)
    assert "unavailable" not in str(w[0].message) and "cannot write" not in str(w[0].message)


def encode_entry_for(x: int) -> bytes:
    b = tw.GuardBuilder({"x": x})
    b.equals("L['x']")
    return tw.store.encode_entry(b.build().to_bytes(), "bytes", b"")


def test_threads_share_a_store(tmp_path: Path) -> None:
    """Four threads, two functions, one Directory object: every answer right, each entry stored
    once per function and loaded by a later reader."""
    store = Directory(tmp_path)
    fs = [
        specialized(store),
        tw.specialize(fx.other_helper, store=store, recompile_limit=64, accumulated_limit=64),
    ]
    errors: list[BaseException] = []

    def run(seed: int) -> None:
        try:
            for i in range(60):
                x = (i * 7 + seed) % 30
                assert fs[0](x) == 2 * x and fs[1](x) == 3 * x
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        threads = [threading.Thread(target=run, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert errors == [] and not any(t.is_alive() for t in threads)
    reader = Directory(tmp_path)
    assert [len(reader.load(f._namespace())) for f in fs] == [30, 30]


@pytest.mark.parametrize(
    "payload",
    [
        lambda good: json.dumps(dict(good, qualname=123)).encode(),
        lambda good: b"[" * 100_000,
        lambda good: b'{"a":' * 100_000,
        lambda good: json.dumps(dict(good, kind="1")).encode(),
        lambda good: json.dumps(dict(good, module=["serial_fixtures"])).encode(),
    ],
    ids=["qualname-123", "deep-list", "deep-object", "kind-str", "module-list"],
)
def test_the_reported_entries_are_skipped_with_one_report(tmp_path: Path, payload: Any) -> None:
    """The review's entries, with the default codec: valid hash, the guards of x == 1."""
    f = specialized(Directory(tmp_path))
    data = raw_entry(genuine()["guards"][1], b"reference", payload(json.loads(genuine()["payload"])))
    d = tmp_path / "v1" / f._namespace()
    d.mkdir(parents=True)
    (d / f"{entry_key(data)}.twe").write_bytes(data)
    (d / "journal").write_bytes(b"\n" + entry_key(data).encode() + b"\n")
    COMPILES.clear()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert f(1) == 2 and f(1) == 2 and f(2) == 4
    assert COMPILES == [1, 2] and len(w) == 1 and entry_key(data) in str(w[0].message)
