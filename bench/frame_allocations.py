"""Count the C heap allocations of tripwire.frame hits (malloc calls, all of the process).

    python bench/frame_allocations.py

Builds a tiny LD_PRELOAD library that counts ``malloc`` calls (build/bench/libmalloc_count.so, with
the system C compiler), then runs a hooked function 10,000 times in a subprocess with it loaded:
the same call (the most recently used entry's fast pass) and three calls cycling through three
entries (the cache's dispatch index and candidate list). Python objects come from pymalloc's
arenas, so they are not counted unless PYTHONMALLOC=malloc; a loop that allocates nothing itself
(no ints above 256) then shows 0 for a hit path that allocates nothing. Prints the counts; no
assertions.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "build", "bench")

_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
static unsigned long count = 0;
static void* (*real_malloc)(size_t) = 0;
void* malloc(size_t n) {
    if (!real_malloc) real_malloc = (void* (*)(size_t))dlsym(RTLD_NEXT, "malloc");
    __atomic_add_fetch(&count, 1, __ATOMIC_RELAXED);
    return real_malloc(n);
}
unsigned long malloc_count(void) { return count; }
"""

_RUN = textwrap.dedent(
    """
    import ctypes
    import tripwire as tw
    from tripwire import frame as twf
    count = ctypes.CDLL(None).malloc_count
    count.restype = ctypes.c_ulong
    def f(x, n):
        return x
    def compile_frame(frame):
        if frame.code is not f.__code__:
            return twf.SKIP
        b = tw.GuardBuilder(frame.f_locals)
        b.type_match("L['x']")
        b.equals("L['n']")
        return frame.code, b.build()
    ITER = [None] * 10000  # the loop allocates nothing itself
    def same():
        for _ in ITER:
            f(1, 0)
    def cycle():
        for _ in ITER:
            f(1, 0); f(1, 1); f(1, 2)
    with twf.hooked(compile_frame) as hook:
        cycle(); same()  # compile three entries, warm up
        for name, run, calls in (("same call", same, 10000), ("cycling 3 entries", cycle, 30000)):
            before = count(); run(); after = count()
            print(f"  {name:<18} {after - before:>6} mallocs for {calls} hooked calls")
        print(f"  (index: {twf.cache_of(f, hook.backend).index_source!r})")
    """
)


def main() -> int:
    os.makedirs(OUT, exist_ok=True)
    src = os.path.join(OUT, "malloc_count.c")
    lib = os.path.join(OUT, "libmalloc_count.so")
    with open(src, "w") as fh:
        fh.write(_C)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", lib, src, "-ldl"], check=True)
    env = dict(os.environ, LD_PRELOAD=lib)
    print(f"Python {sys.version.split()[0]}")
    subprocess.run([sys.executable, "-c", _RUN], env=env, check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
