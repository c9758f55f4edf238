"""tripwire.frame driving numpy work: a function specialised on its arrays' dtype and ndim.

``rms_norm(x, weight, eps)`` normalises the last axis of ``x`` (as in transformer layers). The
frame compiler below generates, for each (dtype, ndim) it meets, a version written for it:

* a 1-D input reduces the whole array (no axis, no keepdims);
* a 2-D C-contiguous input computes the row sums of squares with one matrix-vector product
  (``np.einsum('ij,ij->i')``) instead of materialising ``x * x``;
* float16 inputs accumulate in float32 (the generic code would accumulate in float16);
* any other ndim gets the generic code.

The guards that say when a version applies: ``type(x)`` and ``type(weight)`` are exactly
``numpy.ndarray`` (TYPE_MATCH), and for each of them EQUALS on ``.dtype.str`` (kind, size and
byte order, e.g. ``'<f4'``) and on ``.ndim``; 2-D inputs are also guarded on C order
(EQUALS on ``.flags.c_contiguous``: a strided input gets the generic code, in an entry of its own). ARRAY_MATCH (the catalogue's array guard, from another
branch) is not used here: these guards are built from the sources this branch has, TYPE_MATCH and
EQUALS on ``.dtype`` and ``.ndim`` paths, and would be replaced by one ``b.array_match(...)``.

Run it::

    python examples/frame_numpy.py

It checks every version against the generic code, then times the hooked calls (guards checked in
C++, the specialised code run in the frame) against plain calls of the generic code, for a few
shapes, and prints the cache (one entry per (dtype, ndim)).
"""

from __future__ import annotations

import time
import types
from typing import Any

import numpy as np

import tripwire as tw
from tripwire import frame as twf


def rms_norm(x, weight, eps):
    """x / sqrt(mean(x**2, axis=-1) + eps) * weight, the generic way."""
    ms = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(ms + eps) * weight


# One template per specialisation: same parameters as rms_norm (the frame's layout), and the
# dtype decisions taken here, in Python, once per (dtype, ndim).
_TEMPLATES = {
    "1d": """
def rms_norm(x, weight, eps):
    ms = np.dot(x, x) / x.shape[0]
    return x * (1.0 / np.sqrt(ms + eps)) * weight
""",
    "2d": """
def rms_norm(x, weight, eps):
    ms = np.einsum('ij,ij->i', x, x) / x.shape[1]
    return x * (1.0 / np.sqrt(ms + eps))[:, None] * weight
""",
    "1d_half": """
def rms_norm(x, weight, eps):
    x32 = x.astype(np.float32)
    ms = np.dot(x32, x32) / x.shape[0]
    return (x32 * (1.0 / np.sqrt(ms + eps)) * weight).astype(np.float16)
""",
    "2d_half": """
def rms_norm(x, weight, eps):
    x32 = x.astype(np.float32)
    ms = np.einsum('ij,ij->i', x32, x32) / x.shape[1]
    return (x32 * (1.0 / np.sqrt(ms + eps))[:, None] * weight).astype(np.float16)
""",
}


def _code_from(template: str) -> types.CodeType:
    module = compile(template, "<rms_norm specialisation>", "exec")
    return next(c for c in module.co_consts if isinstance(c, types.CodeType))


def compile_frame(frame: twf.Frame) -> Any:
    if frame.code is not rms_norm.__code__:
        return twf.SKIP
    x, weight = frame.f_locals["x"], frame.f_locals["weight"]
    b = tw.GuardBuilder(frame.f_locals, f_globals=frame.f_globals)
    for name in ("x", "weight"):
        b.type_match(f"L[{name!r}]")  # exactly numpy.ndarray, not a subclass
    if type(x) is not np.ndarray or type(weight) is not np.ndarray:
        return frame.code, b.build()  # not arrays: the generic code, under these type guards
    for name in ("x", "weight"):
        b.equals(f"L[{name!r}].dtype.str")
        b.equals(f"L[{name!r}].ndim")
    b.type_match("L['eps']")
    half = x.dtype == np.float16
    kind = None
    if x.ndim == 1 and x.dtype.kind == "f":
        kind = "1d"
    elif x.ndim == 2 and x.dtype.kind == "f":
        # Guarded either way: the generic entry for a strided input must not shadow the 2-D
        # version for contiguous ones (the most recently used entry that passes wins).
        b.equals("L['x'].flags.c_contiguous")
        kind = "2d" if x.flags.c_contiguous else None
    # The generic code, for this (dtype, ndim), when no template fits.
    code = frame.code if kind is None else _code_from(_TEMPLATES[kind + ("_half" if half else "")])
    print(
        f"  compile: x {x.dtype.str} ndim {x.ndim} -> {kind or 'generic'}{' (f32 accumulation)' if half else ''}"
    )
    return code, b.build()


def _time(fn, *args, n: int) -> float:
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn(*args)
        best = min(best, (time.perf_counter() - t) / n)
    return best * 1e6


# The generic code as another function (its own code object: the compiler never touches it).
generic = types.FunctionType(rms_norm.__code__.replace(), globals(), "generic")


def main() -> None:
    rng = np.random.default_rng(0)
    cases = [
        ("f32 2-D (64, 4096)", rng.standard_normal((64, 4096), dtype=np.float32), np.float32),
        ("f64 2-D (64, 4096)", rng.standard_normal((64, 4096)), np.float64),
        ("f32 1-D (65536,)", rng.standard_normal(65536, dtype=np.float32), np.float32),
        ("f16 2-D (64, 4096)", rng.standard_normal((64, 4096)).astype(np.float16), np.float16),
        ("f32 3-D (4, 16, 4096)", rng.standard_normal((4, 16, 4096), dtype=np.float32), np.float32),
    ]
    weights = [np.linspace(0.5, 1.5, x.shape[-1]).astype(dt) for _, x, dt in cases]
    n = 200
    print("== first calls: one compile per (dtype, ndim), results checked against the generic code")
    with twf.hooked(compile_frame) as hook:
        for (label, x, dt), w in zip(cases, weights, strict=True):
            got, want = rms_norm(x, w, 1e-6), generic(x, w, 1e-6)
            tol = 2e-2 if dt == np.float16 else 1e-4
            assert got.dtype == want.dtype and got.shape == want.shape, label
            assert np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol), label
        print("== a non-contiguous 2-D input misses the 2-D version (its C-order guard) and compiles again")
        xt = cases[0][1][:, ::2]
        assert np.allclose(
            rms_norm(xt, np.ones(xt.shape[1], np.float32), 1e-6), generic(xt, 1.0, 1e-6), atol=1e-4
        )
        hooked = [_time(rms_norm, x, w, 1e-6, n=n) for (_, x, _), w in zip(cases, weights, strict=True)]
        cache = twf.cache_of(rms_norm, hook.backend)
    plain = [_time(generic, x, w, 1e-6, n=n) for (_, x, _), w in zip(cases, weights, strict=True)]
    print("== per call, best of 5 x 200: hooked (guards checked, specialised code) vs generic, no hook")
    for (label, _, _), h, p in zip(cases, hooked, plain, strict=True):
        print(f"    {label:<24} hooked {h:8.1f} us   generic {p:8.1f} us   ({p / h:4.2f}x)")
    print("== cache:", cache)
    for e in cache.entries:
        print(f"    {e.name}: {e.hits} hits, code from {e.payload.code.co_filename}")


if __name__ == "__main__":
    main()
