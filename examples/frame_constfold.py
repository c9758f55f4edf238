"""A small JIT on tripwire.frame: specialise functions on their constant arguments.

Functions decorated with ``@jit`` are compiled when a frame of theirs is about to run: every
argument that is a small constant (int, str, bool, None) is folded into the code (its loads
become constants, and arithmetic, comparisons and ``if`` tests on constants are evaluated), the
function is recompiled from that tree into a code object with the same parameters, and the frame
runs it. EQUALS guards on the folded arguments and TYPE_MATCH guards on the others say when the
specialisation may be reused; tripwire checks them in C++ on every call, on the frame's fast
locals, and runs the cached code in the same frame.

Run it::

    python examples/frame_constfold.py

It prints each compile with the reasons the earlier specialisations did not apply, the folded
bytecode of one specialisation, the cache's hits, and what happens at the recompile limit (the
code switches to RUN_ONLY: cached specialisations keep running, new argument values run the
original).
"""

from __future__ import annotations

import ast
import dis
import inspect
import operator
import textwrap
import time
import types
from typing import Any

import tripwire as tw
from tripwire import frame as twf

_JITTED: dict[types.CodeType, types.FunctionType] = {}
_CONSTANT_TYPES = (int, str, bool, type(None))


def jit(fn: types.FunctionType) -> types.FunctionType:
    """Mark ``fn`` for the frame compiler (top-level functions: no free variables)."""
    if fn.__code__.co_freevars:
        raise TypeError("jit: only functions without free variables")
    _JITTED[fn.__code__] = fn
    return fn


# -- the compiler: partial evaluation on the function's syntax tree ----------------------------------

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_CMPOPS = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}


def _const(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant)


class _Fold(ast.NodeTransformer):
    """Replace loads of the constant arguments, evaluate what becomes constant, drop dead branches."""

    def __init__(self, constants: dict[str, Any]) -> None:
        self.constants = constants

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if isinstance(node.ctx, ast.Load) and node.id in self.constants:
            return ast.copy_location(ast.Constant(self.constants[node.id]), node)
        return node

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        op = _BINOPS.get(type(node.op))
        if op is not None and _const(node.left) and _const(node.right):
            try:
                return ast.copy_location(ast.Constant(op(node.left.value, node.right.value)), node)
            except Exception:  # noqa: BLE001  (left for run time, where it raises as it would)
                pass
        return node

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        if len(node.ops) == 1 and _const(node.left) and _const(node.comparators[0]):
            op = _CMPOPS.get(type(node.ops[0]))
            if op is not None:
                return ast.copy_location(ast.Constant(op(node.left.value, node.comparators[0].value)), node)
        return node

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.AST:
        self.generic_visit(node)
        if all(_const(v) for v in node.values):
            values = [v.value for v in node.values]
            result = all(values) if isinstance(node.op, ast.And) else any(values)
            return ast.copy_location(ast.Constant(result), node)
        return node

    def visit_If(self, node: ast.If) -> Any:
        self.generic_visit(node)
        if _const(node.test):
            return (node.body if node.test.value else node.orelse) or ast.copy_location(ast.Pass(), node)
        return node

    def visit_IfExp(self, node: ast.IfExp) -> ast.AST:
        self.generic_visit(node)
        if _const(node.test):
            return node.body if node.test.value else node.orelse
        return node


def specialise(fn: types.FunctionType, constants: dict[str, Any]) -> types.CodeType:
    """``fn``'s code with the arguments in ``constants`` folded in (same parameters)."""
    source = textwrap.dedent(inspect.getsource(fn))
    tree = ast.parse(source)
    ast.increment_lineno(tree, fn.__code__.co_firstlineno - 1)  # tracebacks point at the real lines
    fdef = tree.body[0]
    assert isinstance(fdef, ast.FunctionDef)
    fdef.decorator_list = []
    # An argument the body assigns to is not a constant of the body.
    stored = {n.id for n in ast.walk(fdef) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    folded = {k: v for k, v in constants.items() if k not in stored}
    tree.body[0] = _Fold(folded).visit(fdef)  # (a statement may become several, or none)
    ast.fix_missing_locations(tree)
    module = compile(tree, fn.__code__.co_filename, "exec")
    code = next(c for c in module.co_consts if isinstance(c, types.CodeType) and c.co_name == fdef.name)
    return code.replace(
        co_qualname=f"{fn.__code__.co_qualname}[{', '.join(f'{k}={v!r}' for k, v in folded.items())}]"
    )


# -- the frame callback ----------------------------------------------------------------------------

compiles: list[str] = []


def compile_frame(frame: twf.Frame) -> Any:
    fn = _JITTED.get(frame.code)
    if fn is None:
        return twf.SKIP  # not ours: never look at this code again
    if len(frame.cache):
        for entry, failure in zip(frame.cache.entries, frame.why_not(), strict=True):
            print(f"    {entry.name} does not apply: {failure.reason if failure else 'it would'}")
    constants = {k: v for k, v in frame.f_locals.items() if type(v) in _CONSTANT_TYPES}
    b = tw.GuardBuilder(frame.f_locals, f_globals=frame.f_globals)
    for name in frame.f_locals:
        if name in constants:
            b.equals(f"L[{name!r}]")  # the specialisation is for this value
        else:
            b.type_match(f"L[{name!r}]")  # and for this type of the others
    code = specialise(fn, constants)
    compiles.append(code.co_qualname)
    print(f"  compile #{len(compiles)}: {code.co_qualname}")
    return code, b.build()


# -- the program -----------------------------------------------------------------------------------


@jit
def poly(x, n, mode):
    """Sum of x**k for k < n, three ways."""
    if mode == "horner":
        acc = 0.0
        for _ in range(n):
            acc = acc * x + 1
        return acc
    if mode == "power":
        total = 0.0
        for k in range(n):
            total += x**k
        return total
    return (x**n - 1) / (x - 1) if x != 1 else float(n)


def main() -> None:
    print("== first calls: compile, then hit")
    with twf.hooked(compile_frame, recompile_limit=4, accumulated_limit=4) as hook:
        assert poly(2.0, 3, "horner") == 7.0
        assert poly(3.0, 3, "horner") == 13.0  # hit: n and mode equal, x a float again
        print("== a new argument value: recompile, with reasons")
        assert poly(2.0, 4, "horner") == 15.0
        assert poly(2.0, 4, "closed") == 15.0
        cache = twf.cache_of(poly, hook.backend)
        entry = next(e for e in cache.entries if "closed" in e.payload.code.co_qualname)
        print(
            f"== the folded bytecode of {entry.name}, {entry.payload.code.co_qualname} (no test of `mode` left)"
        )
        for ins in dis.get_instructions(entry.payload.code):
            if ins.opname in ("LOAD_CONST", "LOAD_FAST", "COMPARE_OP", "POP_JUMP_IF_FALSE", "RETURN_VALUE"):
                print(f"    {ins.opname:<20} {ins.argrepr}")
        print("== the recompile limit (4): the code switches to RUN_ONLY")
        assert poly(2.0, 5, "horner") == 31.0
        assert poly(2.0, 6, "horner") == 63.0  # refused: runs the original from now on
        print(f"    strategy: {twf.strategy_of(poly, hook.backend)}")
        assert poly(2.0, 3, "horner") == 7.0  # a cached specialisation still runs
        n = 200_000
        t = time.perf_counter()
        for _ in range(n):
            poly(1.5, 3, "horner")
        hooked = (time.perf_counter() - t) / n * 1e9
    t = time.perf_counter()
    for _ in range(n):
        poly(1.5, 3, "horner")
    plain = (time.perf_counter() - t) / n * 1e9
    print("== cache:", cache)
    for e in cache.entries:
        print(f"    {e.name} {e.payload.code.co_qualname}: {e.hits} hits")
    print(
        f"== poly(1.5, 3, 'horner'): {hooked:.0f} ns a call specialised (guards checked), {plain:.0f} ns plain"
    )


if __name__ == "__main__":
    main()
