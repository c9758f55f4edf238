"""``python -m tripwire inspect`` / ``diff``: every error is one line on stderr and a non-zero exit,
never a traceback; a store entry is inspected through the guards inside it."""

from __future__ import annotations

import builtins
import os
import socket
import subprocess
import sys

import pytest

import tripwire as tw
from tripwire import __main__ as cli
from tripwire.store import encode_entry


def saved(x=3) -> bytes:
    b = tw.GuardBuilder({"x": x})
    b.type_match("L['x']")
    b.equals("L['x']")
    return b.build().to_bytes()


def run_cli(*args, env=None):
    """(exit code, stdout, stderr) of the command in a child process, as a user runs it."""
    r = subprocess.run(
        [sys.executable, "-m", "tripwire", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )
    return r.returncode, r.stdout, r.stderr


def one_line_error(code, err, *needles):
    assert code != 0
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], (n, err)


def test_inspect_missing_file_directory_unreadable_and_bad_bytes(tmp_path):
    code, _, err = run_cli("inspect", str(tmp_path / "nope.tw"))
    one_line_error(code, err, "nope.tw: no such file")
    code, _, err = run_cli("inspect", str(tmp_path))
    one_line_error(code, err, "is a directory")
    bad = tmp_path / "bad.tw"
    bad.write_bytes(b"not a guard set at all")
    code, _, err = run_cli("inspect", str(bad))
    one_line_error(code, err, "bad.tw", "wrong magic")
    if os.geteuid() != 0:  # root reads anything
        locked = tmp_path / "locked.tw"
        locked.write_bytes(saved())
        locked.chmod(0)
        code, _, err = run_cli("inspect", str(locked))
        one_line_error(code, err, "permission denied")


def test_inspect_reads_a_store_entry_and_a_bare_set(tmp_path):
    data = saved()
    bare, entry = tmp_path / "set.tw", tmp_path / "entry.twe"
    bare.write_bytes(data)
    entry.write_bytes(encode_entry(data, "pickle", b"payload"))
    code, out, err = run_cli("inspect", str(entry))
    assert code == 0, err
    assert "store entry: codec 'pickle'" in out and "EQUALS_MATCH" in out
    code, out2, err = run_cli("inspect", str(bare))
    assert code == 0, err
    assert "EQUALS_MATCH" in out2 and "store entry" not in out2


def test_diff_says_which_file_is_bad(tmp_path):
    good, bad = tmp_path / "a.tw", tmp_path / "b.tw"
    good.write_bytes(saved())
    bad.write_bytes(b"\x00" * 40)
    code, _, err = run_cli("diff", str(good), str(bad))
    one_line_error(code, err, f"diff: {bad}:")
    assert code == 2
    code, _, err = run_cli("diff", str(tmp_path / "gone.tw"), str(good))
    one_line_error(code, err, "gone.tw: no such file")
    other = tmp_path / "c.tw"
    other.write_bytes(saved(4))
    code, out, _ = run_cli("diff", str(good), str(other))
    assert code == 1 and out.startswith("---") and "EQUALS_MATCH" in out


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_inspect_redis_without_a_server_is_one_quick_line(capsys, monkeypatch):
    pytest.importorskip("redis")
    port = _free_port()
    code, _, err = run_cli("inspect", f"redis://127.0.0.1:{port}/0/somekey")
    one_line_error(code, err, f"cannot connect to Redis at 127.0.0.1:{port}")
    # The bound on the wait is the client's configuration (no timed assertion): a 1 s connect
    # timeout and no retries (redis-py retries a refused connection with backoff, about 5 s).
    import redis

    made = []

    class Recording(redis.Redis):
        def __init__(self, **kwargs):
            made.append(kwargs)
            super().__init__(**kwargs)

    monkeypatch.setattr(redis, "Redis", Recording)
    assert cli.main(["inspect", f"redis://127.0.0.1:{port}/somekey"]) == 1
    one_line_error(1, capsys.readouterr().err, f"cannot connect to Redis at 127.0.0.1:{port}")
    (kwargs,) = made
    assert kwargs["socket_connect_timeout"] == 1
    assert kwargs["retry"].get_retries() == 0


def test_redis_without_redis_py_names_pip_install(monkeypatch, capsys):
    real_import = builtins.__import__

    def no_redis(name, *args, **kwargs):
        if name == "redis" or name.startswith("redis."):
            raise ModuleNotFoundError("No module named 'redis'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "redis", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_redis)
    assert cli.main(["inspect", "redis://127.0.0.1:1/key"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install redis" in err
    with pytest.raises(ImportError, match="pip install redis"):
        tw.store.Redis("redis://127.0.0.1:1/0")


def test_from_bytes_of_a_store_entry_says_so():
    entry = encode_entry(saved(), "pickle", b"")
    with pytest.raises(tw.FormatError, match=r"a tripwire store entry.*decode_entry\(data\)\.guards"):
        tw.GuardSet.from_bytes(entry)
    with pytest.raises(tw.FormatError, match="wrong magic"):
        tw.GuardSet.from_bytes(b"\x89TWX" + entry[4:])
