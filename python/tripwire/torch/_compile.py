"""``tripwire.torch.compile``: torch.compile's compiled code, served by tripwire's frame runtime.

Dynamo compiles (its callback, called on a tripwire miss with a view of the frame, never running
it); tripwire checks the entry's guards (imported with ``guards_of``) and runs the transformed code
in the frame (``tripwire.frame``). The per-call scope is a C object (``tripwire.frame.scoped``) that
also makes compile_wrapper's per-call reads, and a compiled module's class ``__call__`` is the
torch adapter's C gate, so a hit costs no Python frame of tripwire's. docs/compile.md has the
contract and the limits. Importing this module imports torch.
"""

from __future__ import annotations

import functools
import inspect
import logging
import operator
import sys
import threading
import types
import warnings
import weakref
from typing import Any

import torch
import torch._dynamo
from torch._dynamo import config as _config
from torch._dynamo import eval_frame as _ef
from torch._dynamo import external_utils, trace_rules
from torch._dynamo.types import FrameAction

import tripwire._core as _core

from .. import frame as twf
from .. import tensors as _tensors
from ..errors import GuardsNotImportable, TorchImportError
from ..logs import RECOMPILES

__all__ = ["SIGNATURE", "VERIFIED_TORCH", "compile", "reset"]

LOG = logging.getLogger("tripwire.torch.compile")
# torch's own recompile log (TORCH_LOGS=recompiles prints it), for tools that read it.
_TORCH_RECOMPILES = torch._logging.getArtifactLogger("torch._dynamo.guards", "recompiles")

SIGNATURE = inspect.signature(torch.compile)
"""torch.compile's signature in the installed torch: ``compile`` takes exactly these keywords."""

VERIFIED_TORCH = ("2.13.",)
"""torch versions this route was checked against (the private APIs it reads: docs/compile.md)."""

# Every torch.compiler.disable wrapper (and so every compiled graph, __compiled_fn_*) runs this
# code: its frames run with tripwire's hook suspended for their whole extent (torch sets its
# callback to None there). Found through a wrapper, as torch builds it.
_DISABLE_FN_CODE: types.CodeType = torch._dynamo.disable(lambda: None).__code__
_INLINE_CODE: types.CodeType = external_utils.wrap_inline(lambda: None).__code__

_call_suspended = twf.suspended(operator.call)


def _disabled_code() -> types.CodeType:
    """The code every torch.compiler.disable wrapper (``DisableContext._fn``) runs instead, in its
    own frame: its ``fn`` called with tripwire's hook suspended for the whole call, through a C
    scope (no Python frame). torch's ``_fn`` also sets torch's callback to None around the call,
    which this route never set, and annotates export traces, which it never runs under; the
    rest is the same call. Same arguments and free variables (``fn``, ``self``, in that order)."""
    fn = self = None

    def _fn(*args: Any, **kwargs: Any) -> Any:
        # The code runs under the wrapper's globals (torch's module): the C scope is found on
        # the wrapper's DisableContext (a class attribute set below).
        return self._tripwire_call_suspended(fn, *args, **kwargs)  # type: ignore[attr-defined]

    return _fn.__code__


_ef.DisableContext._tripwire_call_suspended = staticmethod(_call_suspended)  # type: ignore[attr-defined]
_DISABLED_REPLACEMENT = _disabled_code()
if _DISABLED_REPLACEMENT.co_freevars != _DISABLE_FN_CODE.co_freevars:
    _DISABLED_REPLACEMENT = None  # type: ignore[assignment]  # another torch: SKIP_RECURSIVE serves it
_warned: set[str] = set()
_warn_lock = threading.Lock()


def _warn_once(key: str, message: str) -> None:
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


class _FrameView:
    """What Dynamo's callback reads from a frame (torch 2.13's DynamoFrameType): the frame is
    not running yet, so ``f_lasti`` is -1 and ``f_locals`` holds the arguments only."""

    __slots__ = ("closure", "f_builtins", "f_code", "f_globals", "f_lasti", "f_lineno", "f_locals")

    def __init__(self, frame: twf.Frame) -> None:
        self.f_code = frame.code
        self.f_locals = dict(frame.f_locals)
        self.f_globals = frame.f_globals
        self.f_builtins = frame.f_builtins
        self.closure = frame.function.__closure__ or ()
        self.f_lasti = -1
        self.f_lineno = frame.code.co_firstlineno


# Every live compiled object, for reset(); each keeps the codes it has seen.
_compiled: weakref.WeakSet[_Compiled] = weakref.WeakSet()
_frame_states: weakref.WeakKeyDictionary[types.CodeType, dict[str, Any]] = weakref.WeakKeyDictionary()


def reset() -> None:
    """Forget every entry ``tripwire.torch.compile`` compiled (torch._dynamo.reset() calls it)."""
    for caches in {id(c.caches): c.caches for c in list(_compiled)}.values():
        caches.reset()
    _frame_states.clear()


class _Caches:
    """The frame-runtime backend key of a set of caches: one per code object, shared by every
    ``tripwire.torch.compile`` call whose Dynamo backend is equal (torch's own test: entries on a
    code object are shared by all torch.compile calls, and an entry serves a call whose backend
    equals the entry's), or one per call with ``isolate_recompiles=True``."""

    __slots__ = ("__weakref__", "codes", "torch_backend")

    def __init__(self, torch_backend: Any) -> None:
        self.torch_backend = torch_backend
        # The codes these caches were asked about, by any compile sharing them (reset() clears
        # them even when the compile that missed is gone and another one hits).
        self.codes: weakref.WeakSet[types.CodeType] = weakref.WeakSet()

    def reset(self) -> None:
        for code in list(self.codes):
            twf.reset(code, self)
        self.codes.clear()

    def __repr__(self) -> str:
        return f"torch.compile({getattr(self.torch_backend, 'compiler_name', self.torch_backend)!r})"


_shared_caches: list[weakref.ref[_Caches]] = []
_shared_lock = threading.Lock()


def _caches_for(callback: Any, isolated: bool) -> _Caches:
    """The caches a compile uses: a new key when isolated, else the live key whose backend equals
    this compile's (``==``, as torch's lookup compares them; torch's backend wrappers are
    unhashable, and a compile runs this once)."""
    backend = _ef.innermost_backend(callback)
    if isolated:
        return _Caches(backend)
    with _shared_lock:
        _shared_caches[:] = [r for r in _shared_caches if r() is not None]
        live = [key for key in (r() for r in _shared_caches) if key is not None]
    # Compared outside the lock: a backend's __eq__ is user code, which may compile in turn. Two
    # compiles racing here may both add a key: their caches are then separate, never mixed.
    for key in live:
        if _same_backend(key.torch_backend, backend):
            return key
    key = _Caches(backend)
    with _shared_lock:
        _shared_caches.append(weakref.ref(key))
    return key


def _same_backend(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - a backend whose __eq__ raises shares nothing
        return False


# Dynamo's limits while tripwire's miss calls its callback (tripwire applies the real ones).
_UNLIMITED = 2**31 - 1


class _Compiled:
    """One ``tripwire.torch.compile`` call: Dynamo's callback for it, tripwire's hook (its
    ``backend`` key, ``caches``, names the caches it shares) and the torch.compile'd fallback."""

    def __init__(
        self,
        ctx: Any,
        torch_compiled: Any,
        fullgraph: bool,
        recompile_limit: int | None,
        isolated: bool = False,
    ) -> None:
        self.callback = ctx.callback
        self.caches = _caches_for(ctx.callback, isolated)
        self.enter_exit_hooks = list(getattr(ctx, "enter_exit_hooks", ()))
        self.torch_compiled = torch_compiled
        self.fullgraph = fullgraph
        self.recompile_limit = recompile_limit  # torch.compile's keyword; None: the config's
        limit, accumulated = self._limits()  # for each new cache; _on_miss refreshes them
        self.hook = twf.Hook(
            self._on_miss,
            backend=self.caches,
            recompile_limit=limit,
            accumulated_limit=accumulated,
            on_limit="run_only",
            raise_errors=True,  # Dynamo's own errors propagate as under torch.compile (_on_miss decides)
        )
        _compiled.add(self)

    def _limits(self) -> tuple[int, int]:
        """The cache limits Dynamo applies now: the keyword, else config.recompile_limit, and
        config.accumulated_recompile_limit, read on each miss as Dynamo reads them."""
        limit = self.recompile_limit if self.recompile_limit is not None else _config.recompile_limit
        return max(1, int(limit)), max(1, int(_config.accumulated_recompile_limit))

    @property
    def codes(self) -> weakref.WeakSet[types.CodeType]:
        return self.caches.codes

    # -- the miss ------------------------------------------------------------------------------
    def _on_miss(self, frame: twf.Frame) -> Any:
        # tripwire's own machinery (the fallback, a LAMBDA guard's helper) never gets here: the
        # hook skips it before calling back (_package.is_own_file).
        code = frame.code
        if code is _DISABLE_FN_CODE:  # torch.compiler.disable, a compiled graph: hook off inside
            if _DISABLED_REPLACEMENT is None:
                return twf.SKIP_RECURSIVE
            from ..builder import GuardBuilder

            # No guard: the replacement reads fn from each wrapper's own closure.
            try:
                return _DISABLED_REPLACEMENT, GuardBuilder({}, f_globals=frame.f_globals).build()
            except Exception:  # noqa: BLE001 - the recursive skip serves it as well, only slower
                return twf.SKIP_RECURSIVE
        self.codes.add(code)
        stance = _ef._stance.stance
        if stance in ("force_eager", "eager_on_recompile"):
            return None  # run it uncompiled this time; the stance is read again next time
        # config.disable is Dynamo's callback's to apply: it skips the code for good and names
        # the skip for fullgraph's "found no compiled frames", as under torch.compile.
        if stance == "fail_on_recompile" and len(frame.cache) and not trace_rules.check(code):
            raise RuntimeError(
                "Detected recompile when torch.compile stance is 'fail_on_recompile'. "
                f"filename: '{code.co_filename}', function name: '{code.co_name}', "
                f"line number: {code.co_firstlineno}; " + _reasons(frame)
            )
        limits = self._limits()
        if limits != (frame.cache.recompile_limit, frame.cache.accumulated_limit):
            frame.cache.set_limits(*limits)
        limit = frame.limit_reached()
        if limit is not None:
            return self._at_limit(frame, limit)
        if len(frame.cache):
            _log_recompile(frame)
        state = _frame_states.setdefault(code, {})
        cleanups = [enter() for enter in self.enter_exit_hooks]
        try:
            # Without record_runtime_overhead, Dynamo's code calls no profiler-region helpers
            # around its graph arguments (two torch.compiler.disable'd calls, about ten Python
            # frames per call, that record only while a profiler runs). Code compiled here never
            # runs under a profiler: the scope (_divert) sends those calls to torch.compile's wrapper,
            # which runs torch's code, compiled with the regions. (config.patch is
            # process-wide for the compile, as every Dynamo config patch is.)
            #
            # The limits are tripwire's to apply (above, on tripwire's cache of the code): Dynamo's
            # own check counts torch's C cache entries of the code, which only a torch.compile of
            # the same function fills, and would refuse tripwire's first compile after it.
            with _config.patch(
                record_runtime_overhead=False,
                recompile_limit=_UNLIMITED,
                accumulated_recompile_limit=_UNLIMITED,
            ):
                result = self.callback(_FrameView(frame), None, state)
        finally:
            for cleanup in cleanups:
                cleanup()
        return self._serve(frame, result)

    def _at_limit(self, frame: twf.Frame, limit: str) -> Any:
        code = frame.code
        message = (
            f"torch._dynamo hit config.{limit} ({getattr(frame.cache, limit)}) on {code.co_qualname} "
            f"({code.co_filename}:{code.co_firstlineno}); "
        )
        if self.fullgraph:
            from torch._dynamo.exc import FailOnRecompileLimitHit

            raise FailOnRecompileLimitHit(message + "fullgraph=True: not falling back to eager")
        RECOMPILES.warning(
            "%srunning its cached entries only from now on (RUN_ONLY). %s", message, _reasons(frame)
        )
        torch._dynamo.utils.counters["stats"]["recompile_limit_hit"] += 1
        return twf.RUN_ONLY

    def _serve(self, frame: twf.Frame, result: Any) -> Any:
        guarded = getattr(result, "guarded_code", None)
        if guarded is not None:
            why = _core._frame_incompatibility(frame.code, guarded.code)
            if why is not None:  # never expected from Dynamo; a miss must not raise for it
                _warn_once(
                    f"layout:{id(frame.code)}",
                    f"tripwire.torch.compile: Dynamo's code for {frame.code.co_qualname} cannot run in "
                    f"its frame ({why}); that frame runs uncompiled",
                )
                _ran_uncompiled[0] += 1
                return None
            gs = _import_guards(guarded, frame)
            if gs is None:
                _ran_uncompiled[0] += 1
                return None  # warned: this frame runs uncompiled, Dynamo is asked again next time
            _suspend_graphs(guarded.code, frame.f_globals)
            return guarded.code, gs
        strategy = getattr(result, "frame_exec_strategy", None)
        if strategy is None or not getattr(result, "apply_to_code", True):
            return None
        cur, recursive = strategy.cur_action, strategy.recursive_action
        if cur == FrameAction.SKIP:
            return twf.SKIP_RECURSIVE if recursive == FrameAction.SKIP else twf.SKIP
        if cur == FrameAction.RUN_ONLY:
            # Dynamo applied a limit tripwire's cache is below (tripwire's own was checked before
            # the callback, Dynamo's lifted for it): torch.compile's recompile_limit keyword, which
            # Dynamo re-applies inside the callback, counted torch's own entries of the code.
            code = frame.code
            _warn_once(
                f"refused:{id(code)}",
                f"tripwire.torch.compile: Dynamo refused to compile {code.co_qualname} "
                f"({code.co_filename}:{code.co_firstlineno}): its recompile limit counted "
                f"torch.compile's own cache entries of this code, not tripwire's "
                f"({len(frame.cache)}); it runs its cached entries only from now on",
            )
            return twf.RUN_ONLY
        return None


def _suspend_graphs(code: types.CodeType, f_globals: dict[str, Any]) -> None:
    """Serve the compiled graphs that ``code`` calls as C objects: each ``__compiled_fn_*`` global
    Dynamo installed for this compile (a name unique to it, read by no other code) is a
    DisableContext wrapper, whose frame the hook would otherwise intercept and serve with
    _disabled_code's Python frame; it becomes ``tripwire.frame.suspended(fn)``, the same call of
    the same graph with the hook suspended for its whole extent, and no Python frame. Dynamo's
    cleanup deletes the global by name, whatever it holds."""
    for name in code.co_names:
        if not name.startswith("__compiled_fn"):
            continue
        wrapper = f_globals.get(name)
        if getattr(wrapper, "__code__", None) is not _DISABLE_FN_CODE:
            continue  # Dynamo's specialization dispatcher, or already replaced
        graph = _closure_value(wrapper, "fn")
        if graph is not None:
            f_globals[name] = twf.suspended(graph)


def _reasons(frame: twf.Frame) -> str:
    out = []
    for i, failure in enumerate(frame.why_not()):
        if failure is not None:
            out.append(f"- entry {i}: {failure}")
    return "triggered by the following guard failure(s):\n" + "\n".join(out) if out else ""


def _log_recompile(frame: twf.Frame) -> None:
    """A recompile in torch's TORCH_LOGS=recompiles form (tripwire's own ``recompiles`` log has
    already printed its reasons: tripwire.frame does that for every miss of a code with entries)."""
    if not _TORCH_RECOMPILES.isEnabledFor(logging.DEBUG):
        return
    code = frame.code
    _TORCH_RECOMPILES.debug(
        "Recompiling function %s in %s:%d\n    %s",
        code.co_name,
        code.co_filename,
        code.co_firstlineno,
        _reasons(frame).replace("\n", "\n    "),
    )


def _import_guards(guarded: Any, frame: twf.Frame) -> Any:
    """The entry's guards as a tripwire GuardSet over the frame's globals, or None (with one
    warning) when they cannot be served: then the frame runs uncompiled this time. Guards with no
    exact tripwire form are evaluated by torch's own leaf objects (guards_of's fallback="torch");
    when some cannot be imported at all, torch's whole guard manager decides, as one LAMBDA."""
    from ._guards_of import guards_of

    try:
        gs = guards_of(guarded)
        if gs._globals is frame.f_globals:
            return gs
        why = "the entry reads another globals dict than the frame's"
    except (GuardsNotImportable, TorchImportError) as e:
        why = str(e)
    except Exception as e:  # noqa: BLE001 - an import bug must not fail a call whose user code ran
        why = f"importing them raised {type(e).__name__}: {e}"
    gm = guarded.guard_manager
    if getattr(gm, "global_scope", {}).get("G", frame.f_globals) is frame.f_globals:
        from ..builder import GuardBuilder

        check = gm.check

        def torch_decides(f_locals: Any) -> bool:
            return bool(check(dict(f_locals)))  # torch's root takes a dict

        try:
            b = GuardBuilder(frame.f_locals, f_globals=frame.f_globals)
            b.predicate(torch_decides, f"torch's guard manager ({why.splitlines()[0]})")
            leaf = b.build()
            LOG.debug(
                "tripwire.torch.compile: %s: torch's guard manager decides: %s", frame.code.co_qualname, why
            )
            return leaf
        except Exception as e:  # noqa: BLE001 - a miss never raises here: run uncompiled (below)
            why = f"{why}; torch's guard manager as a guard failed too: {e}"
    _warn_once(
        f"import:{id(frame.code)}",
        f"tripwire.torch.compile: the guards of {frame.code.co_qualname} cannot be served ({why}); "
        "that frame runs uncompiled",
    )
    return None


# -- per call ------------------------------------------------------------------------------------
# compile_wrapper's per-call reads, made by the scope in C (no Python frame of tripwire's):
# - _divert(): where compile_wrapper does something else than compile, torch.compile's own wrapper
#   runs the call: a stance that runs eagerly; a profiler wanting torch's "Torch-Compiled Region";
#   an FX symbolic trace or a torch.jit.trace in progress (the wrapper refuses them with its
#   RuntimeError; Dynamo asked under them fails, or skips the code for good); an export in
#   progress (the wrapper runs the function as is inside its trace). The tests are screens read
#   in C: module globals that torch rebinds (set_stance replaces _ef._stance), read through the
#   modules on every call, and the JIT tracer's C++ thread-local (the torch adapter's
#   `jit_tracer.active`). The FX and export flags are process-wide (another thread's compile sets
#   them while it traces), so a call they divert is decided in Python by _torch_wrapper_decides,
#   compile_wrapper's own tests: torch's wrapper, or the same scope without the screens.
#   config.disable is read on misses, as it is a compile-time switch.
# - _depth (enter) and _undo_to (on_error): the functorch layer-stack depth, which compile_wrapper
#   restores when the call raised (generated code is not guarded with try/finally, so a graph that
#   pushed a functorch layer leaves it behind). Both are torch's C functions: calling them costs
#   no Python frame. The scope then puts the dispatch-key TLS back (``dispatch_keys``), as after
#   every call, in C.
def _divert() -> tuple[tuple[Any, str, Any], ...]:
    """The scopes' divert tests (the torch adapter is loaded: compile() checked)."""
    return (
        (_ef, "_stance.stance", "force_eager"),
        (torch.autograd.profiler, "_is_profiler_enabled", True),
        (torch.fx._symbolic_trace, "_is_fx_tracing_flag", True),
        (torch.compiler, "_is_exporting_flag", True),
        (sys.modules[_ADAPTER].jit_tracer, "active", True),
    )


_depth = torch._C._functorch.get_dynamic_layer_stack_depth
_undo_to = torch._C._functorch.pop_dynamic_layer_stack_and_undo_to_depth


def _torch_wrapper_decides() -> bool:
    """Whether torch.compile's wrapper does something else than compile this call: compile_wrapper's
    per-call tests (torch 2.13, in its order), which the scope's divert tests screen for. A fake
    kernel invocation of another compile (its first test) is not screened (docs/compile.md)."""
    if _ef._stance.stance == "force_eager" or torch.autograd.profiler._is_profiler_enabled:
        return True
    forced = _config.force_compile_during_fx_trace
    if torch.compiler.is_exporting() and not forced:
        from torch._higher_order_ops.utils import _in_hop_compile

        if not _in_hop_compile() and torch._guards.TracingContext.try_get() is not None:
            return True
    if torch.fx._symbolic_trace.is_fx_symbolic_tracing() and not forced:
        return True
    return bool(torch._C._is_tracing())


def _fallback(torch_compiled: Any, bound: bool = False, hooked: Any = None) -> Any:
    """What a scope calls when it does not set its hook: torch.compile's callable, called with
    the scope's arguments (``bound``: without the first, the module a scope over an unbound
    ``forward`` receives), or ``hooked``, the same scope without divert tests, when a divert test
    held but torch.compile's wrapper would compile (_torch_wrapper_decides)."""

    def fallback(*args: Any, **kwargs: Any) -> Any:
        # Reached when another PEP 523 function is installed (torch's: a torch.compile'd caller,
        # or torch's hook left behind by an earlier torch error) or when a _divert test held.
        foreign = twf.status()["eval_frame"] == "foreign"
        if hooked is not None and not foreign and not _torch_wrapper_decides():
            return hooked(*args, **kwargs)
        if bound:
            args = args[1:]
        if foreign and torch._C._dynamo.eval_frame.get_eval_frame_callback() in (None, False):
            _warn_once(
                "foreign",
                "tripwire.torch.compile: another frame hook is installed (torch's, left by an earlier "
                "torch.compile error?); calls go through torch.compile's own runtime",
            )
        return torch_compiled(*args, **kwargs)

    return fallback


# Frames Dynamo compiled that tripwire ran uncompiled (their guards could not be served, with a
# warning): fullgraph's per-call check counts them as compiled, as torch.compile would have run them.
_ran_uncompiled = [0]
_frame_runs = _core._frame_run_stats


def _fullgraph_checked(fn: Any) -> Any:
    """``fullgraph=True``'s per-call check, as compile_wrapper makes it: a call that returns
    without having run any compiled frame (Dynamo skipped every frame: ``config.disable``, a code
    it never traces) raises torch's RuntimeError, naming the frames Dynamo reported skipping. A
    compiled frame is a replacement run by the frame runtime (a process-wide count, read under
    the GIL: another thread's compiled frame in the same interval hides a skip, never invents
    one). Only the outermost fullgraph call checks, as in torch."""

    def fullgraph_call(*args: Any, **kwargs: Any) -> Any:
        tls = _ef.dynamo_tls
        if tls.skip_reasons is not None:  # inside another fullgraph call: that one checks
            return fn(*args, **kwargs)
        tls.skip_reasons = []  # Dynamo's skips append to it (attributes only: this runs hooked)
        try:
            before = sum(_frame_runs()) + _ran_uncompiled[0]
            result = fn(*args, **kwargs)
            if sum(_frame_runs()) + _ran_uncompiled[0] == before and _ef._stance.stance == "default":
                reasons = tls.skip_reasons
                message = "torch.compile with fullgraph=True found no compiled frames."
                if reasons:
                    message += " Skipped frames:\n" + "\n".join(f"  - {r}" for r in reasons)
                else:
                    message += " Compilation was not attempted and no cached compiled code was found."
                raise RuntimeError(message)
            return result
        finally:
            tls.skip_reasons = None

    return fullgraph_call


def _scope(fn: Any, c: _Compiled, bound: bool = False) -> Any:
    if c.fullgraph:
        fn = _fullgraph_checked(fn)
    to_torch = _fallback(c.torch_compiled, bound)
    hooked = twf.scoped(fn, c.hook, fallback=to_torch, enter=_depth, on_error=_undo_to, dispatch_keys=True)
    return twf.scoped(
        fn,
        c.hook,
        fallback=_fallback(c.torch_compiled, bound, hooked),
        divert=_divert(),
        enter=_depth,
        on_error=_undo_to,
        dispatch_keys=True,
    )


class _Context:
    """What OptimizedModule calls to wrap its forward (in place of torch's dynamo_ctx)."""

    def __init__(self, c: _Compiled, ctx: Any, options: dict[str, Any]) -> None:
        self.compiled = c
        self.torch_ctx = ctx
        self.options = options  # compile()'s keywords: a copy or an unpickled module compiles again
        self.callback = ctx.callback
        self.fullgraph = c.fullgraph
        self.wrapped: Any = None  # what torch's OptimizedModule._initialize wrapped last

    def __call__(self, fn: Any) -> Any:
        self.wrapped = fn
        scope = _scope(fn, self.compiled)
        functools.update_wrapper(scope, fn)  # the module's forward: its name, doc and signature
        return scope


_modhooks = torch.nn.modules.module
# nn.Module's own __call__ (the function _wrapped_call_impl, which __call__ is bound to in the
# class body): a module whose __call__ is another runs it on torch's route.
_MODULE_CALL = torch.nn.Module.__dict__["_wrapped_call_impl"]


def _module_machinery_is_torchs() -> bool:
    """Whether nn.Module's __call__ and _call_impl are torch's own functions, as defined in
    torch/nn/modules/module.py: the machinery the gate skips (a profiler or tracer that patched
    them runs on torch's route, where they apply)."""
    d = torch.nn.Module.__dict__
    call, impl = d.get("__call__"), d.get("_call_impl")
    return (
        call is _MODULE_CALL
        and isinstance(impl, types.FunctionType)
        and impl.__qualname__ == "Module._call_impl"
        and impl.__code__.co_filename == _modhooks.__file__
        and getattr(getattr(_MODULE_CALL, "__code__", None), "co_filename", None) == _modhooks.__file__
    )


_ADAPTER = "tripwire._torch_adapter"  # _adapter_build.MODULE, loaded by compile()'s ensure_torch


class OptimizedModule(_ef.OptimizedModule):
    """What ``tripwire.torch.compile`` returns for an ``nn.Module``: torch's OptimizedModule
    (parameters, state_dict, attribute access, train()/eval() are the original module's), whose
    forward runs in tripwire's frame runtime.

    Its ``__call__`` is the torch adapter's C gate (``ModuleCall``, cpp/adapters/torch/
    compiled_module.cpp), installed by the first ``_initialize`` with the adapter loaded: a call
    with no module hook anywhere (global, on this wrapper, on the original module) skips the
    nn.Module call machinery that would only find no hook, with no Python frame of tripwire's:
    torch's route runs ``Module._wrapped_call_impl`` and ``_call_impl`` twice (this wrapper,
    then the original module inside the scope) and a context manager, about a dozen Python
    frames. Any hook, a replaced ``forward`` or ``__dict__``, ``Module.compile()``'s
    ``_compiled_call_impl`` or a JIT trace in progress sends the call down torch's whole route
    (``super().__call__``), which applies them; a module class with its own ``__call__`` always
    enters the scope over it."""

    _tripwire_fast: Any = None  # a class attribute: the gate's state is assigned to __dict__

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Pickling and copy.deepcopy rebuild the wrapper as torch's __reduce__ does, from the
        # original module (copied or unpickled) and the compile: here compile()'s keywords, since
        # the frame caches hold code objects, which do not pickle. The copy compiles afresh.
        ctx: _Context = self.dynamo_ctx  # type: ignore[assignment]  # ours, set by compile()
        return (_compiled_again, (self._orig_mod, ctx.options))

    def _initialize(self) -> None:
        super()._initialize()
        self._tripwire_fast = None
        adapter = sys.modules.get(_ADAPTER)
        if adapter is None or not _core.torch_adapter_installed():
            return  # unpickled in a process without the adapter: torch's route
        ctx: _Context = self.dynamo_ctx  # type: ignore[assignment]  # ours, set by compile()
        scope, wrapped = self.__dict__.get("forward"), ctx.wrapped
        if not isinstance(scope, twf._FrameScope):
            return  # a lazy module's _call_lazy_check: torch's route
        orig = self._orig_mod
        direct = None
        forward = getattr(type(orig), "forward", None)
        if (
            isinstance(wrapped, types.MethodType)
            and wrapped.__self__ is orig
            and wrapped.__func__ is _MODULE_CALL
            and isinstance(forward, types.FunctionType)
        ):
            # torch wrapped orig.__call__, nn.Module's own (its hooks run outside Dynamo, which
            # then intercepts forward's frame): without hooks, the gate enters that frame
            # directly, orig first. A class's own __call__ runs whatever it does: torch's route.
            direct = _scope(forward, ctx.compiled, bound=True)
        # The instance dicts: the gate reads the hook dicts from them per call, and finds this
        # state through the wrapper's current __dict__ (replaced wholesale: torch's route).
        self._tripwire_fast = adapter.ModuleCallState(
            self.__dict__, scope, orig, orig.__dict__, direct, forward
        )
        # Once; until then (or while nn.Module's machinery is not torch's own) torch's
        # __call__ is inherited. The gate re-checks that machinery on every call.
        if "__call__" not in OptimizedModule.__dict__ and _module_machinery_is_torchs():
            OptimizedModule.__call__ = adapter.ModuleCall(OptimizedModule, _modhooks, _ef)  # type: ignore[method-assign]


_unsupported_reasons = (
    (
        lambda: (
            bool(getattr(_config, "compiled_autograd", False))
            or torch._dynamo.compiled_autograd.compiled_autograd_enabled
        ),
        "compiled autograd",
    ),
    (lambda: bool(getattr(_config, "caching_precompile", False)), "precompile packages"),
    (
        lambda: (
            bool(getattr(_config, "enable_guard_collectives", False))
            and torch.distributed.is_available()
            and torch.distributed.is_initialized()
        ),
        "distributed guard collectives",
    ),
)


def compile(model: Any = None, **kwargs: Any) -> Any:
    """``torch.compile(model, **kwargs)`` whose compiled code runs in tripwire's frame runtime,
    with tripwire's imported guards. Takes exactly torch.compile's keyword arguments (``SIGNATURE``).
    Where this route does not apply (an unverified torch version, compiled autograd, precompile,
    distributed guard collectives) it returns torch.compile's own result, with one warning."""
    bound = SIGNATURE.bind(model, **kwargs)
    bound.apply_defaults()
    options = dict(bound.arguments)
    model = options.pop("model")
    if model is None:
        return functools.partial(compile, **kwargs)
    torch_compiled = torch.compile(model, **options)
    if options.get("disable") or torch_compiled is model:
        return torch_compiled
    if not torch.__version__.startswith(VERIFIED_TORCH):
        _warn_once(
            "version",
            f"tripwire.torch.compile was verified on torch {', '.join(v + 'x' for v in VERIFIED_TORCH)}, "
            f"not {torch.__version__}: using torch.compile",
        )
        return torch_compiled
    _tensors.ensure_torch()  # loads (or builds) the adapter, once
    if not _core.torch_adapter_installed():
        # Without it, tensor guards are read in Python and the per-call protections have no C
        # route: torch.compile's own runtime is faster.
        _warn_once(
            "adapter",
            "tripwire.torch.compile needs the torch adapter "
            f"({_tensors.adapter_status()}): using torch.compile",
        )
        return torch_compiled
    for test, what in _unsupported_reasons:
        if test():
            _warn_once(what, f"tripwire.torch.compile does not support {what}: using torch.compile")
            return torch_compiled
    if isinstance(torch_compiled, _ef.OptimizedModule):
        ctx = torch_compiled.dynamo_ctx
    else:
        ctx = _closure_value(torch_compiled, "self")
    if ctx is None or not callable(getattr(ctx, "callback", None)):
        _warn_once(
            "ctx", "tripwire.torch.compile: torch.compile's callback was not found: using torch.compile"
        )
        return torch_compiled
    c = _Compiled(
        ctx,
        torch_compiled,
        bool(options.get("fullgraph")),
        options.get("recompile_limit"),
        bool(options.get("isolate_recompiles")),
    )
    if isinstance(model, torch.nn.Module):
        return OptimizedModule(model, _Context(c, ctx, options))  # type: ignore[arg-type]
    scope = _scope(model, c)
    functools.update_wrapper(scope, model)
    scope._torchdynamo_orig_callable = model
    scope._tripwire_compiled = c
    return scope


def _compiled_again(model: Any, options: dict[str, Any]) -> Any:
    """An unpickled or copied compiled module: ``compile`` of its module with the same keywords."""
    return compile(model, **options)


def _closure_value(fn: Any, name: str) -> Any:
    code = getattr(fn, "__code__", None)
    cells = getattr(fn, "__closure__", None)
    if code is None or not cells or name not in code.co_freevars:
        return None
    try:
        return cells[code.co_freevars.index(name)].cell_contents
    except ValueError:
        return None


def _patch_dynamo_reset() -> None:
    """torch._dynamo.reset() (and torch.compiler.reset(), which calls it) clears tripwire's
    entries too: they hold Dynamo's transformed code, whose globals reset() forgets."""
    original = torch._dynamo.reset
    if getattr(original, "_tripwire_reset", False):
        return

    @functools.wraps(original)
    def reset_all() -> None:
        original()
        reset()

    reset_all._tripwire_reset = True  # type: ignore[attr-defined]
    torch._dynamo.reset = reset_all


_patch_dynamo_reset()
# Dynamo never traces this module: the fallback runs under torch's own hook (a torch.compile'd
# caller), where torch's callback would otherwise compile it.
trace_rules.add(__name__)
