"""The benchmarks' one callgrind harness: run a Python child under ``valgrind --tool=callgrind``
and read the instruction totals it wrote.

A child collects only inside one C loop of bench/floor.c (``_floor.repeat_call`` is
``tw_bench_repeat_call``), and callgrind writes one dump after each call of that loop, so a child
that runs the loop k times gives k totals, in call order. A per-check figure is then a total over
its count, or the difference of two totals over the difference of their counts (the fixed costs
of a call cancel). ``function=None`` collects the whole child instead (one total).
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence

REPEAT_CALL = "tw_bench_repeat_call"  # _floor.repeat_call's C loop (bench/floor.c)


def _total(path: str) -> int | None:
    with open(path) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    return None


def totals(
    args: Sequence[str],
    out_base: str,
    *,
    function: str | None = REPEAT_CALL,
    instr_atstart: bool = True,
    env: Mapping[str, str] | None = None,
) -> list[int] | None:
    """Run ``python *args`` under callgrind, its outputs at ``out_base`` (``out_base.1``, ... one
    per call of ``function``): the instruction total of each call of ``function`` in call order
    (of the whole run when ``function`` is None), or None when the child failed (the tail of its
    stderr is written to ours). ``instr_atstart=False``: the child starts the instrumentation
    itself (``_floor.start_instrumentation``), so its imports run at native speed. ``env``: extra
    environment variables."""
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_base}"]
    if not instr_atstart:
        cmd.append("--instr-atstart=no")
    if function is not None:
        cmd += ["--collect-atstart=no", f"--toggle-collect={function}", f"--dump-after={function}"]
    cmd += [sys.executable, *args]
    r = subprocess.run(
        cmd, capture_output=True, text=True, env=None if env is None else {**os.environ, **env}
    )
    if r.returncode != 0:
        sys.stderr.write(r.stderr[-2000:])
        return None
    if function is None:
        parts = [out_base]
    else:
        numbered = [p for p in glob.glob(glob.escape(out_base) + ".*") if p.rsplit(".", 1)[1].isdigit()]
        parts = sorted(numbered, key=lambda p: int(p.rsplit(".", 1)[1]))
    found = [_total(p) for p in parts]
    if not found or any(t is None for t in found):
        sys.stderr.write(f"callgrind: no totals in {out_base}*\n")
        return None
    return [t for t in found if t is not None]
