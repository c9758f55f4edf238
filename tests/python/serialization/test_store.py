"""Stores (tripwire.store) and @specialize(store=...): entries shared between real processes,
writers killed mid-write, corrupt and foreign entries skipped, eviction, and a real Redis server
that stops and comes back."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

import serial_fixtures as fx
import tripwire as tw
from redis_server import RedisServer, free_port, redis_server_fixture  # noqa: F401 (a fixture)
from tripwire.store import (
    BytesCodec,
    Directory,
    ReferenceCodec,
    StoreWarning,
    decode_entry,
    encode_entry,
    entry_key,
    namespace_of,
)

HERE = Path(__file__).parent
NS = namespace_of(["test_store"])


@functools.cache
def a_blob(value: Any = 1) -> bytes:
    """An entry whose payload names ``value`` (the same bytes for the same value in a process:
    the guards record where they were installed)."""
    b = tw.GuardBuilder({"x": value})
    b.equals("L['x']")
    return encode_entry(b.build().to_bytes(), "bytes", b"payload-%d" % value)


def ns(name: str) -> str:
    return namespace_of([name])


def save(store: Any, namespace: str, data: bytes) -> str:
    key = entry_key(data)
    store.save(namespace, key, data)
    return key


def plant(root: Path, namespace: str, key: str, content: bytes | None = None) -> Path:
    """What a writer of the store (or a bit flip) leaves: a file under an entry's name, and its
    journal record. ``content`` None: only the record."""
    d = root / "v1" / namespace
    d.mkdir(parents=True, exist_ok=True)
    if content is not None:
        (d / f"{key}.twe").write_bytes(content)
    with open(d / "journal", "ab") as j:
        j.write(b"\n" + key.encode() + b"\n")
    return d / f"{key}.twe"


def test_entry_round_trip_and_bad_entries() -> None:
    data = a_blob()
    e = decode_entry(data)
    assert (
        e.codec == "bytes" and e.payload == b"payload-1" and tw.GuardSet.from_bytes(e.guards).check({"x": 1})
    )
    for bad, msg in [
        (data[:30], "truncated"),
        (b"X" + data[1:], "wrong magic"),
        (data[:8] + b"\x02" + data[9:], "entry format version 2"),
        (data[:-1] + bytes([data[-1] ^ 1]), "hash mismatch"),
        (data + b"x", "header declares"),
    ]:
        with pytest.raises(tw.FormatError, match=msg):
            decode_entry(bad)


def test_directory_save_load_skip_and_report_each_once(tmp_path: Path) -> None:
    d = Directory(tmp_path)
    save(d, NS, a_blob(1))
    save(d, NS, a_blob(2))
    save(d, NS, a_blob(1))  # the same key again: nothing changes
    assert d.load(NS) == [a_blob(1), a_blob(2)] and d.load(ns("other")) == []
    torn, future = a_blob(3), bytearray(a_blob(4))
    future[8] = 9
    plant(tmp_path, NS, entry_key(torn), torn[:-5])  # torn
    plant(tmp_path, NS, entry_key(bytes(future)), bytes(future))  # a newer entry format
    (tmp_path / "v1" / NS / ".tmp-x.part").write_bytes(b"half")  # a killed writer's: never read
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert len(d.load(NS)) == 2
        assert len(d.load(NS)) == 2  # reported once per store object
    assert len([x for x in w if issubclass(x.category, StoreWarning)]) == 2  # one per entry
    assert {Path(p).name for p, _ in d.skipped} == {
        f"{entry_key(torn)}.twe",
        f"{entry_key(bytes(future))}.twe",
    }
    assert any("version 9" in why for _, why in d.skipped)


def test_directory_default_location(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TRIPWIRE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert Directory().path == tmp_path / "tripwire"
    monkeypatch.setenv("TRIPWIRE_CACHE_DIR", str(tmp_path / "x"))
    assert Directory().path == tmp_path / "x"


def test_directory_evicts_oldest_first(tmp_path: Path) -> None:
    size = len(a_blob(0))
    d = Directory(tmp_path, max_bytes=size * 5)  # every save lists the store (16 x size > max)
    keys = []
    for i in range(12):
        keys.append(save(d, ns(f"n{i % 3}"), a_blob(i)))
        path = tmp_path / "v1" / ns(f"n{i % 3}") / f"{keys[-1]}.twe"
        os.utime(path, (1000 + i, 1000 + i))
    left = sorted(p.name for p, _, _ in d.entries())
    total = sum(s for _, s, _ in d.entries())
    assert total <= size * 5 and len(left) >= 4
    assert f"{keys[11]}.twe" in left and f"{keys[0]}.twe" not in left  # the newest stays, the oldest went
    reader = Directory(tmp_path)
    assert sorted(entry_key(b) for i in range(3) for b in reader.load(ns(f"n{i}"))) == sorted(
        n[:-4] for n in left
    )


_WRITER = """
import sys, os
sys.path[:0] = [{here!r}, {here!r} + "/../support"]
from tripwire.store import Directory
import tripwire as tw
from test_store import a_blob, save, NS
d = Directory({root!r}, max_bytes=1 << 62)  # never collects: the journal keeps every record
for i in range({n}):
    save(d, NS, a_blob(i % {distinct}))
"""


def test_concurrent_writers(tmp_path: Path) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER.format(here=str(HERE), root=str(tmp_path), n=40, distinct=7)]
        )
        for _ in range(4)
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0
    d = Directory(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no corrupt entry
        blobs = d.load(NS)
    assert sorted(decode_entry(b).payload for b in blobs) == sorted(b"payload-%d" % i for i in range(7))
    assert not d.skipped
    assert not list((tmp_path / "v1" / NS).glob(".tmp-*"))
    journal = (tmp_path / "v1" / NS / "journal").read_bytes()
    assert len(journal) == 34 * 160  # every save's record, none torn or interleaved


def test_a_save_racing_the_journal_rewrite_keeps_its_record(tmp_path: Path) -> None:
    """Eviction rewrites a journal of mostly dead records. An entry saved by another writer
    between the rewrite's listing and its rename appends to the journal being replaced; the
    rewrite must still leave a record for it, or readers never see the entry."""
    other = Directory(tmp_path, max_bytes=1 << 62)

    class Racing(Directory):
        def _write(self, dfd: int, name: str, data: bytes) -> None:
            if name == "journal":
                save(other, NS, a_blob(2))  # published after the listing, before the rename
            super()._write(dfd, name, data)

    d = Racing(tmp_path, max_bytes=1 << 62)
    for _ in range(130):  # one live entry, a journal far larger than it needs
        save(other, NS, a_blob(1))
    journal = tmp_path / "v1" / NS / "journal"
    before = journal.stat().st_ino
    d._collect()
    assert journal.stat().st_ino != before  # rewritten
    assert len(journal.read_bytes()) < 130 * 34
    assert sorted(decode_entry(b).payload for b in Directory(tmp_path).load(NS)) == [
        b"payload-1",
        b"payload-2",
    ]


_KILLED = """
import sys, os, time
sys.path[:0] = [{here!r}, {here!r} + "/../support"]
from tripwire.store import Directory
from test_store import a_blob, save, NS

class Slow(Directory):
    def _write(self, dfd, name, data):
        fd = os.open(".tmp-killed.part", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=dfd)
        os.write(fd, data[: len(data) // 2])
        print("paused", flush=True)
        time.sleep(60)  # killed here, half written

d = Directory({root!r})
save(d, NS, a_blob(1))
save(Slow({root!r}), NS, a_blob(2))
"""


def test_a_writer_killed_mid_write_leaves_no_corrupt_entry(tmp_path: Path) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", _KILLED.format(here=str(HERE), root=str(tmp_path))],
        stdout=subprocess.PIPE,
        text=True,
    ) as p:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "paused"
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    d = tmp_path / "v1" / NS
    (done,) = d.glob("*.twe")
    assert decode_entry(done.read_bytes()).payload == b"payload-1"
    assert len(list(d.glob(".tmp-*.part"))) == 1  # the half-written file, never served
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [decode_entry(b).payload for b in Directory(tmp_path).load(NS)] == [b"payload-1"]


def test_codecs() -> None:
    r = ReferenceCodec(modules=["serial_fixtures"])
    assert r.decode(r.encode(fx.helper)) is fx.helper
    assert r.decode(r.encode(fx.Point)) is fx.Point
    with pytest.raises(tw.NotSerializable, match="closure or lambda"):
        r.encode(fx.make_closure(1))
    with pytest.raises(tw.NotSerializable, match="not in the codec's modules"):
        r.encode(json.dumps)
    with pytest.raises(tw.NotSerializable, match="only Python functions and classes"):
        r.encode(len)
    with pytest.raises(tw.FormatError, match="not a reference payload"):
        r.decode(b"\x80\x04cos\nsystem\n")  # a pickle is just bad data here


def test_a_payload_reference_cannot_choose_what_runs() -> None:
    """A payload is called with the caller's arguments on every hit: a stored reference to any
    imported function outside the codec's modules (subprocess.getoutput, os.system) is refused,
    whatever its fingerprint."""
    import subprocess as sp

    from tripwire.references import RefKind, fingerprint

    r = ReferenceCodec(modules=["serial_fixtures"])
    for target, kind in [(sp.getoutput, RefKind.FUNCTION), (os.system, RefKind.FUNCTION)]:
        forged = json.dumps(
            {
                "kind": int(kind),
                "module": target.__module__,
                "qualname": target.__qualname__,
                "fingerprint": fingerprint(kind, target).hex(),
            }
        ).encode()
        with pytest.raises(tw.FormatError, match="refused"):
            r.decode(forged)
    forged = json.dumps(
        {"kind": int(RefKind.OBJECT), "module": "serial_fixtures", "qualname": "CONFIG", "fingerprint": ""}
    ).encode()
    with pytest.raises(tw.FormatError, match="refused"):
        r.decode(forged)
    assert BytesCodec().decode(BytesCodec().encode(b"abc")) == b"abc"
    with pytest.raises(tw.NotSerializable):
        BytesCodec().encode("abc")


# -- @specialize(store=...) across real processes ------------------------------------------------------

_APP = """
import json, os, sys
import tripwire as tw
from tripwire.store import {store_expr_import}

COMPILES = []

def fast_add(x, y):
    return ("fast", x + y)

def compiler(fn, args, builder):
    COMPILES.append(repr(args))
    return fast_add if isinstance(args["x"], int) else fn

@tw.specialize(compiler=compiler, store={store_expr})
def add(x, y):
    return ("slow", x + y)

if __name__ == "__main__":
    out = [add(1, 2), add(3, 4), add("a", "b"), add(1.5, 2)]
    print(json.dumps({{"results": out, "compiles": COMPILES, "loaded": add.store_loads}}))
"""


def run_app(tmp_path: Path, store_import: str, store_expr: str) -> dict:
    app = tmp_path / "tw_store_app.py"
    app.write_text(_APP.format(store_expr_import=store_import, store_expr=store_expr))
    out = subprocess.run(
        [sys.executable, str(app)], capture_output=True, text=True, timeout=120, cwd=tmp_path, check=True
    )
    return json.loads(out.stdout)


def test_a_second_process_hits_without_compiling(tmp_path: Path) -> None:
    store = f"Directory({str(tmp_path / 'store')!r})"
    first = run_app(tmp_path, "Directory", store)
    assert len(first["compiles"]) == 4 and first["loaded"] == 0
    second = run_app(tmp_path, "Directory", store)
    assert second["compiles"] == [] and second["loaded"] == 4
    assert second["results"] == first["results"] == [["fast", 3], ["fast", 7], ["slow", "ab"], ["slow", 3.5]]


def test_the_store_never_widens_what_hits(tmp_path: Path) -> None:
    store = Directory(tmp_path)
    calls: list[Any] = []

    def compiler(fn: Any, args: Any, b: Any) -> Any:
        calls.append(dict(args))
        return fn

    a = tw.specialize(fx.helper, compiler=compiler, store=store)
    a(1)
    b = tw.specialize(fx.helper, compiler=compiler, store=store)  # another "process": a fresh cache
    assert b(1) == 2
    assert len(calls) == 1 and b.store_loads == 1
    b(2)  # the stored entry guards x == 1: 2 compiles
    assert len(calls) == 2


def test_closures_do_not_share_entries(tmp_path: Path) -> None:
    """Two closures of one code share module, qualname and code, not their cells: a payload
    compiled for one must never be served to the other."""
    store = Directory(tmp_path)

    def compiler(fn: Any, args: Any, b: Any) -> Any:
        k = fn.__closure__[0].cell_contents
        return lambda x: ("compiled for", k)

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        one = tw.specialize(fx.make_closure(1), compiler=compiler, store=store)
        two = tw.specialize(fx.make_closure(2), compiler=compiler, store=store)
        assert one(5) == ("compiled for", 1)
        assert two(5) == ("compiled for", 2)
    assert any("store not used" in str(x.message) for x in w)
    assert Directory(tmp_path).entries() == []


def test_entries_that_cannot_be_stored_stay_in_memory_with_one_warning(tmp_path: Path) -> None:
    store = Directory(tmp_path)

    def compiler(fn: Any, args: Any, b: Any) -> Any:
        return lambda *a: "compiled"  # a closure: the reference codec cannot store it

    f = tw.specialize(fx.other_helper, compiler=compiler, store=store)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert f(1) == "compiled" and f(2) == "compiled" and f(1) == "compiled"
    assert len([x for x in w if issubclass(x.category, StoreWarning)]) == 1
    assert "not stored" in str(w[0].message)
    assert Directory(tmp_path).entries() == []


# -- Redis -----------------------------------------------------------------------------------------


def test_redis_store_round_trip_and_two_processes(redis_server: RedisServer, tmp_path: Path) -> None:
    r = tw.store.Redis(redis_server.url)
    save(r, NS, a_blob(1))
    assert [decode_entry(x).payload for x in r.load(NS)] == [b"payload-1"]
    store = f"Redis({redis_server.url!r})"
    first = run_app(tmp_path, "Redis", store)
    second = run_app(tmp_path, "Redis", store)
    assert len(first["compiles"]) == 4 and second["compiles"] == [] and second["loaded"] == 4
    assert second["results"] == first["results"]


def test_redis_down_falls_back_to_compiling_and_loses_nothing(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    store = tw.store.Redis(redis_server.url, timeout=0.3, retry_after=0.5)
    calls: list[Any] = []

    def compiler(fn: Any, args: Any, b: Any) -> Any:
        calls.append(args["x"])
        return fn

    f = tw.specialize(fx.helper, compiler=compiler, store=store)
    assert f(1) == 2
    redis_server.stop()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert f(2) == 4 and f(3) == 6 and f(2) == 4  # compiles go on, hits too
        time.sleep(0.6)  # past the back-off: the server is tried again, still down
        assert f(5) == 10
    assert len([x for x in w if issubclass(x.category, StoreWarning)]) == 1
    assert calls == [1, 2, 3, 5] and store.pending == 3
    redis_server.start()  # the same port, empty (no persistence): pending entries are rewritten
    time.sleep(0.6)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert f(4) == 8
    assert [str(x.message) for x in w] == [
        f"tripwire: Redis store {redis_server.url} is available again; 3 kept entries written"
    ]
    assert store.pending == 0
    g = tw.specialize(fx.helper, compiler=compiler, store=tw.store.Redis(redis_server.url))
    assert g(2) == 4 and g(3) == 6 and g(4) == 8 and g(5) == 10
    assert calls == [1, 2, 3, 5, 4] and g.store_loads == 4  # entry 1 was lost with the server's memory


def test_redis_unreachable_from_the_start(tmp_path: Path) -> None:
    pytest.importorskip("redis")
    store = tw.store.Redis(f"redis://127.0.0.1:{free_port()}/0", timeout=0.2)
    f = tw.specialize(fx.helper, store=store)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert f(1) == 2 and f(2) == 4
    assert len([x for x in w if issubclass(x.category, StoreWarning)]) == 1


# -- the CLI ------------------------------------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tripwire", *args], capture_output=True, text=True, timeout=60
    )


def test_cli_inspect_and_diff(tmp_path: Path) -> None:
    a = tw.guards_for(fx.frames()[1], fx.__dict__)
    (tmp_path / "a.twg").write_bytes(a.to_bytes())
    frame = dict(fx.frames()[1], c=fx.Color.GREEN, extra=3)
    (tmp_path / "b.twe").write_bytes(
        encode_entry(tw.guards_for(frame, fx.__dict__).to_bytes(), "bytes", b"xyz")
    )
    out = cli("inspect", str(tmp_path / "a.twg"))
    assert out.returncode == 0, out.stderr
    assert "format version: 1" in out.stdout and "enum_member serial_fixtures:Color.RED" in out.stdout
    assert "EQUALS_MATCH: L['cfg']['mode'] == 'fast'" in out.stdout
    out = cli("inspect", str(tmp_path / "b.twe"))
    assert "store entry: codec 'bytes', payload 3 bytes" in out.stdout
    out = cli("diff", str(tmp_path / "a.twg"), str(tmp_path / "b.twe"))
    assert out.returncode == 1
    assert "-EQUALS_MATCH: L['c'] == <enum_member serial_fixtures:Color.RED>" in out.stdout
    assert "+EQUALS_MATCH: L['c'] == <enum_member serial_fixtures:Color.GREEN>" in out.stdout
    assert "+EQUALS_MATCH: L['extra'] == 3" in out.stdout
    assert cli("diff", str(tmp_path / "a.twg"), str(tmp_path / "a.twg")).returncode == 0
    (tmp_path / "bad").write_bytes(b"\x89TWG\r\n\x1a\n\x07\x00")
    out = cli("inspect", str(tmp_path / "bad"))
    assert out.returncode == 1 and ("format version 7" in out.stderr or "truncated" in out.stderr)


def test_cli_inspect_from_redis(redis_server: RedisServer) -> None:
    r = tw.store.Redis(redis_server.url)
    key = save(r, NS, a_blob(5))
    out = cli("inspect", f"redis://127.0.0.1:{redis_server.port}/{r.entry_key(NS, key)}")
    assert out.returncode == 0, out.stderr
    assert "EQUALS_MATCH: L['x'] == 5" in out.stdout and "payload 9 bytes" in out.stdout
