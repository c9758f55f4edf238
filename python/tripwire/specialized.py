"""The `Specialized` callable behind ``@tripwire.specialize``: a JIT-style decorator on top of :class:`tripwire.Cache`.

::

    import tripwire as tw

    def my_compiler(fn, example_args, builder):
        # example_args: the call's arguments bound to fn's parameters, {name: value}
        builder.id_match("L['model']")           # add guards of your own if the code needs them
        return make_fast_version(fn, example_args)  # any callable taking fn's arguments

    @tw.specialize(compiler=my_compiler, backend="mine")
    def f(model, x, n=3): ...

On each call the arguments are bound to the signature (keyword arguments, defaults, ``*args`` as a
tuple, ``**kwargs`` as a dict) into ``f_locals`` and the cache is looked up. A hit calls the
compiled callable with the original arguments. A miss (with entries already cached) logs why each
entry failed on ``tripwire.recompiles`` (see :mod:`tripwire.logs`), infers input guards with
:func:`tripwire.infer_into` under the policy, calls ``compiler(fn, example_args, builder)``,
builds the guards (the compiler's included), caches the result and calls it.

The returned :class:`Specialized` is a vectorcall C++ callable (``tripwire._core.FastDispatch``).
For a Python function every call is bound to the parameters in C++ (keywords, defaults,
``*args``, ``**kwargs``) and the guards read ``L['name']`` straight from the argument vector: a hit
builds no dict and runs no Python code before the compiled callable. Only a miss builds
``f_locals`` and enters Python. Other callables, and calls the interpreter would reject, are
bound in Python with :mod:`inspect` (which raises the usual ``TypeError``).
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import threading
import time
import types
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from ._core import FastDispatch, _enable_vectorcall, _fast_setup
from .builder import GuardBuilder
from .cache import Cache, OnLimit, recording_recompiles
from .errors import FormatError, NotSerializable, RecompileLimitExceeded
from .failure import Failure
from .guard_set import GuardSet
from .infer import Policy, infer_into
from .logs import report_compile, report_recompile_of
from .overview import summarize_cache
from .references import RefKind, fingerprint
from .store import (
    Codec,
    ReferenceCodec,
    Store,
    _report,
    decode_entry,
    encode_entry,
    entry_key,
    namespace_of,
)

_store_log = logging.getLogger("tripwire.store")
# The codec name of an entry whose payload is the specialised function itself (empty payload).
_SELF_CODEC = "tripwire:function"

__all__ = ["Compiler", "Specialized", "specialize"]

_Args = ParamSpec("_Args")
_Ret = TypeVar("_Ret")
_MArgs = ParamSpec("_MArgs")
_MRet = TypeVar("_MRet")
_T = TypeVar("_T")

Compiler = Callable[[Callable[..., Any], dict[str, Any], GuardBuilder], Callable[..., Any]]
"""``compiler(fn, example_args, builder) -> callable``: see :func:`specialize`."""


def _identity_compiler(fn: Callable, example_args: Mapping[str, Any], builder: GuardBuilder) -> Callable:
    """The default compiler: the function itself (the cache then only records the specialisations
    seen, with their guards and recompile reasons)."""
    return fn


class Specialized(FastDispatch, Generic[_Args, _Ret]):
    """A function specialised by :func:`specialize`. Call it like the function.

    Attributes:
        cache: the :class:`tripwire.Cache` of compiled entries (one per specialisation).
        __wrapped__: the original function (``functools.update_wrapper`` copies its name, doc,
            module and qualname).
        compiler, backend, policy, error_on_recompile: as given to :func:`specialize`.

    Thread safety: lookups take no lock (the Cache is safe for concurrent lookups and inserts);
    misses are handled under one lock per specialised function, and the cache is looked up again
    under it (uncounted), so concurrent first calls with the same arguments compile once. A
    compiler that
    hands a call of the same function to another thread and waits for it deadlocks.

    Re-entrancy: while a thread compiles, calls of this function from that thread (the compiler
    running it on examples, a recursive function) that miss run the original function; they are
    neither compiled nor cached.

    Methods: ``Specialized`` is a descriptor, so ``obj.method(...)`` binds ``self`` as the first
    argument (``L['self']`` in the guards; user objects are guarded by type).

    Typing: ``Specialized[P, R]`` keeps the function's signature (a ParamSpec), so a type
    checker checks calls of the decorated function, and of ``why_not``, as calls of the function.
    """

    if TYPE_CHECKING:
        # The call is FastDispatch's vectorcall; a __call__ defined at run time would replace it.
        def __call__(self, *args: _Args.args, **kwargs: _Args.kwargs) -> _Ret: ...

    def __init__(
        self,
        fn: Callable[_Args, _Ret],
        *,
        compiler: Compiler | None = None,
        backend: str | None = None,
        recompile_limit: int = 8,
        accumulated_limit: int = 256,
        on_limit: OnLimit = "raise",
        policy: Policy | None = None,
        error_on_recompile: bool = False,
        store: Store | None = None,
        codec: Codec | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"specialize needs a function, not {type(fn).__name__}")
        if compiler is not None and not callable(compiler):
            raise TypeError(f"compiler must be callable, not {type(compiler).__name__}")
        policy = Policy() if policy is None else policy
        if not isinstance(policy, Policy):
            raise TypeError(f"policy must be a tripwire.Policy, not {type(policy).__name__}")
        functools.update_wrapper(self, fn)
        # A callable object has no __qualname__ of its own: name it after its type.
        self._label = getattr(fn, "__qualname__", None) or type(fn).__qualname__
        self.compiler = _identity_compiler if compiler is None else compiler
        self.backend = (
            backend if backend is not None else getattr(self.compiler, "__name__", repr(self.compiler))
        )
        self.policy = policy
        self.error_on_recompile = bool(error_on_recompile)
        self.on_limit = on_limit
        self.cache = Cache(
            recompile_limit=recompile_limit, accumulated_limit=accumulated_limit, on_limit=on_limit
        )
        self.cache._owner = ("specialize", self._label, self._source_line(fn), str(self.backend))
        self._fn = fn
        self._accumulated_limit = accumulated_limit
        self._globals = getattr(fn, "__globals__", None)
        inspect.signature(fn)  # a callable without a signature fails here, not at its first call
        self._code = getattr(fn, "__code__", None)  # the code the cache's entries were compiled for
        self._lock = threading.Lock()
        self._local = threading.local()
        self._compiles = 0
        self.store = store
        if codec is None:
            # Payloads are called on every hit: loaded by name only from the function's own
            # module and the compiler's (store.ReferenceCodec).
            own = [
                m for m in (getattr(fn, "__module__", None), getattr(self.compiler, "__module__", None)) if m
            ]
            codec = ReferenceCodec(modules=[m for m in own if isinstance(m, str)])
        self.codec: Codec = codec
        # The store namespace read last, where its next read starts, and the keys of its entries
        # this process has (loaded, skipped or compiled): each entry is read and decoded once.
        self._store_namespace: str | None = None
        self._code_digest: tuple[Any, str] | None = None
        self._store_position: Any = None
        self._store_keys: set[str] = set()
        self._store_warned: set[str] = set()
        self.store_loads = 0  # entries loaded from the store into the cache
        self.store_skipped: list[tuple[str, str]] = []  # (key, why) of stored entries not used
        # The C++ call path: binds and looks up in C++; unbindable calls go to _call_python,
        # misses to _fast_miss.
        _fast_setup(self, self.cache, fn, Specialized._call_python, Specialized._fast_miss)

    # -- calling (the call itself is FastDispatch's vectorcall; no __call__ here) ------------------
    def _bind(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """``f_locals`` for a call bound in Python: the arguments bound to the signature as the
        interpreter binds them, defaults applied. The signature is read afresh (defaults may have
        been reassigned or mutated since the last call)."""
        code = getattr(self._fn, "__code__", None)
        if code is not self._code:
            # fn.__code__ was replaced: a different function. Dynamo keeps its cache on the code
            # object, so a new code starts empty. The C++ path is switched off for good: the
            # layout it binds with may match again later (the old code restored) while the cache
            # holds the other code's entries; every call is bound here from now on.
            with self._lock:
                if code is not self._code:
                    self._fast_disable()
                    self.cache.clear()
                    self._code = code
        return bind_call(inspect.signature(self._fn), args, kwargs, self._label)

    def _call_python(self, args: tuple, kwargs: dict | None) -> Any:
        """A call FastDispatch did not bind. For a Python function whose code is unchanged that
        means the call is invalid: the function itself raises the interpreter's TypeError (and
        if it does not, it simply runs, uncompiled). Otherwise (other callables, a replaced
        ``__code__``) bind in Python, look up and dispatch."""
        kwargs = kwargs or {}
        # Bindable (a Python function, the C++ path still on) with the same code: invalid call.
        if self._bindable() and getattr(self._fn, "__code__", None) is self._code:
            return self._fn(*args, **kwargs)
        f_locals = self._bind(args, kwargs)
        compiled = self.cache.lookup(f_locals)
        if compiled is None:
            return self._miss(args, kwargs, f_locals)
        return compiled(*args, **kwargs)

    def _fast_miss(self, args: tuple, kwargs: dict | None, f_locals: dict[str, Any]) -> Any:
        """A miss on the C++ path (f_locals bound and looked up once, the miss counted)."""
        return self._miss(args, kwargs or {}, f_locals)

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> Specialized[_Args, _Ret]: ...
    @overload
    def __get__(
        self: Specialized[Concatenate[_T, _MArgs], _MRet], obj: _T, objtype: type | None = None
    ) -> Callable[_MArgs, _MRet]: ...
    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        return types.MethodType(self, obj)

    # -- diagnostics ---------------------------------------------------------------------------------
    def why_not(self, *args: _Args.args, **kwargs: _Args.kwargs) -> list[Failure | None]:
        """Why each cached entry (most recently used first) would not match a call with these
        arguments: the first failing guard as a :class:`tripwire.Failure`, or None for an entry
        that matches. Empty when nothing is cached. The arguments are bound as a call binds them
        (a call the function would reject raises its TypeError); nothing is called, compiled or
        counted. For a method, pass the instance first: ``C.method.why_not(obj, x)``."""
        return self.cache.why_not(self._bind(args, kwargs))

    def explain(self) -> str:
        """What this function's cache holds and how it got there: the counts, each entry with its
        guard tree (where each guard was installed), and the compiles with why each cached entry
        did not match the call that caused it (as :func:`tripwire.summary` and
        :func:`tripwire.report` show it)."""
        return summarize_cache(self.cache, guards=True).describe(guards=True)

    def __repr__(self) -> str:
        return f"<tripwire.specialize {self._label} backend={self.backend!r} entries={len(self.cache)}>"

    # -- the miss path -----------------------------------------------------------------------------
    def _miss(self, args: tuple, kwargs: dict, f_locals: dict[str, Any]) -> Any:
        if getattr(self._local, "compiling", False):
            return self._fn(*args, **kwargs)  # re-entrant call from this thread's compiler
        with self._lock:
            # Another thread may have compiled it meanwhile; this second look counts nothing.
            entry = self.cache._lookup_uncounted(f_locals)
            if entry is None and self.store is not None and self._load_store():
                entry = self.cache._lookup_uncounted(f_locals)  # another process compiled it
            compiled = None if entry is None else entry.payload
            if compiled is None:
                compiled = self._compile(f_locals)
        if compiled is None:  # a limit was hit under the "fallback" policy
            return self._fn(*args, **kwargs)
        return compiled(*args, **kwargs)

    def _compile(self, f_locals: dict[str, Any]) -> Callable | None:
        """Compile and cache for ``f_locals`` (called under the lock). Returns the compiled
        callable, or None when the cache refused it (fallback policy)."""
        cached = len(self.cache)
        # The cache would refuse any entry: do not compile for nothing.
        full = self.on_limit == "fallback" and cached >= self._accumulated_limit
        names: list[str | None] = []
        failures: list[Failure | None] | None = None if cached else []  # [] for a first compile
        # Why each entry missed, only when asked for: to raise, to log, or to record with the
        # compile (record_recompiles(): summary(), report()).
        if cached:
            got = report_recompile_of(
                self._fn, self.cache, f_locals, error=self.error_on_recompile, record=recording_recompiles()
            )
            if got is not None:
                names, failures = got
        if full:
            return None
        start = time.perf_counter()
        builder = GuardBuilder(f_locals, f_globals=self._globals)
        infer_into(builder, f_locals, self.policy)
        self._local.compiling = True
        try:
            compiled = self.compiler(self._fn, f_locals, builder)
        except BaseException as e:
            if isinstance(e, Exception):
                e.add_note(
                    f"while compiling {self._where()} with tripwire.specialize (backend {self.backend!r})"
                )
            raise
        finally:
            self._local.compiling = False
        if compiled is None or not callable(compiled):
            raise TypeError(
                f"the compiler {getattr(self.compiler, '__qualname__', self.compiler)!r} returned "
                f"{type(compiled).__name__} for {self._where()}; it must return a callable"
            )
        try:
            gs = builder.build()
        except Exception as e:  # e.g. a guard the compiler added does not hold on the example
            e.add_note(f"while building the guards of {self._where()} with tripwire.specialize")
            raise
        seconds = time.perf_counter() - start
        name = f"{self._label}#{self._compiles}"
        if self.cache.insert(gs, compiled, name=name, f_locals=f_locals) is False:
            return None
        report_compile(self._fn, name, gs, seconds)
        self._compiles += 1
        self.cache._record_compile(name, seconds, names, failures)
        if self.store is not None:
            self._save_entry(gs, compiled)
        return compiled

    # -- the store ---------------------------------------------------------------------------------
    def _namespace(self) -> str:
        """What must match for entries to be shared: the function (by name and code), the
        backend, the codec, the Python version and the format."""
        fn = self._fn
        code = getattr(fn, "__code__", None)
        # The code's digest walks all its bytecode and constants: computed once per code object,
        # not on every miss (fn.__code__ may be replaced: the memo is checked by identity).
        memo = self._code_digest
        if memo is None or memo[0] is not code:
            memo = self._code_digest = (
                code,
                fingerprint(RefKind.CODE, code).hex() if code is not None else "",
            )
        digest = memo[1]
        compiler = self.compiler
        parts = [
            str(getattr(fn, "__module__", "")),
            self._label,
            digest,
            str(self.backend),
            f"{getattr(compiler, '__module__', '')}:{getattr(compiler, '__qualname__', type(compiler).__qualname__)}",
            self.codec.name,
            "py{}.{}".format(*sys.version_info[:2]),
            "format1",
        ]
        return namespace_of(parts)

    def _store_problem(self, what: str, why: str) -> None:
        """One report per kind of problem and function; debug logs after that."""
        message = f"tripwire: {self._where()}: {what}: {why}"
        if what in self._store_warned:
            _store_log.debug("%s", message)
            return
        self._store_warned.add(what)
        _report(message)

    def _shareable(self) -> bool:
        """Whether entries of this function may be shared through a store: only a function that
        a name leads to and that captures nothing. Two closures of one code (made in a loop, say)
        share module, qualname and code but not their cells, and a payload compiled for one must
        never be found by the other; their guards cannot tell them apart."""
        fn = self._fn
        qualname = getattr(fn, "__qualname__", "")
        if getattr(fn, "__closure__", None) or "<locals>" in qualname or "<lambda>" in qualname:
            self._store_problem(
                "store not used",
                "a closure or lambda shares its name and code with others of its kind; "
                "specialize a module-level function to share entries between processes",
            )
            return False
        return True

    def _store_state(self) -> str:
        """The namespace for the function as it is now; a new one (its code was replaced) starts
        reading from the beginning."""
        ns = self._namespace()
        if ns != self._store_namespace:
            self._store_namespace, self._store_position = ns, None
            self._store_keys = set()
        return ns

    def _load_store(self) -> bool:
        """Insert the stored entries this process has not seen; True if any was inserted.

        Each entry is a boundary: whatever decoding, validating or resolving it raises (any
        Exception, MemoryError and RecursionError included: an entry's size is capped, so they
        come from its contents, and a process really out of memory or stack raises them again
        in the compile that follows) skips it with one report, and the call compiles.
        KeyboardInterrupt and SystemExit are the process's and propagate."""
        assert self.store is not None
        if not self._shareable():
            return False
        ns = self._store_state()
        try:
            batch, self._store_position = self.store.read(ns, self._store_position, self._store_keys)
        except Warning:
            raise  # a store's report that the application's warning filters turned into an error
        except Exception as e:  # noqa: BLE001 - a store of the user's own (tripwire's report their problems)
            self._store_problem("the store could not be read", f"{type(e).__name__}: {e}")
            return False
        inserted = False
        # A finalizer or weakref callback that calls this function while an entry loads (this
        # thread holds the lock) runs it uncompiled, as a call from the compiler does.
        compiling = getattr(self._local, "compiling", False)
        self._local.compiling = True
        try:
            for data in batch:
                try:
                    key = entry_key(data)
                    if key in self._store_keys:
                        continue
                    self._store_keys.add(key)
                    gs, payload = self._decode_stored(data)
                    if self.cache.insert(gs, payload, name=f"{self._label}#stored-{key[:8]}") is False:
                        break
                except RecompileLimitExceeded:
                    break
                except Exception as e:  # noqa: BLE001 - any failure of one entry skips it
                    self._skip_stored(data, e)
                    continue
                self.store_loads += 1
                inserted = True
        finally:
            self._local.compiling = compiling
        return inserted

    def _decode_stored(self, data: bytes) -> tuple[GuardSet, Any]:
        """An entry's guards and callable payload; raises for anything else."""
        entry = decode_entry(data)
        if entry.codec == _SELF_CODEC:  # the function itself (the default compiler)
            if entry.payload:
                raise FormatError("a stored 'the function itself' payload must be empty")
            return GuardSet.from_bytes(entry.guards, f_globals=self._globals), self._fn
        if entry.codec != self.codec.name:
            raise FormatError(
                f"entry stored with codec {entry.codec!r}, this function uses {self.codec.name!r}"
            )
        gs = GuardSet.from_bytes(entry.guards, f_globals=self._globals)
        payload = self.codec.decode(entry.payload)
        if not callable(payload):
            raise FormatError(f"the codec decoded a {type(payload).__name__}, which is not callable")
        return gs, payload

    def _skip_stored(self, data: Any, e: BaseException) -> None:
        """One report for a stored entry that is not used (its key is in _store_keys: never again)."""
        try:
            key = entry_key(data)
        except Exception:  # noqa: BLE001 - a store of the user's own returned something else
            key = f"<a {type(data).__name__}, not bytes>"
        why = f"{type(e).__name__}: {e}" if not isinstance(e, FormatError) else str(e)
        self.store_skipped.append((key, why))
        _report(f"tripwire: {self._where()}: skipped stored entry {key}: {why}; compiling instead")

    def _save_entry(self, gs: GuardSet, compiled: Any) -> None:
        """Store a new entry. Nothing raised here reaches the caller: the entry is cached
        already, and one report per kind of problem says why it is not stored."""
        assert self.store is not None
        if not self._shareable():
            return
        try:
            ns = self._store_state()
            if compiled is self._fn:  # the function itself: the loader has it
                data = encode_entry(gs.to_bytes(), _SELF_CODEC, b"")
            else:
                data = encode_entry(gs.to_bytes(), self.codec.name, self.codec.encode(compiled))
            key = entry_key(data)
            self._store_keys.add(key)
            self.store.save(ns, key, data)
        except NotSerializable as e:
            self._store_problem("entry kept in memory only, not stored", str(e))
        except Warning:
            raise  # a store's report that the application's warning filters turned into an error
        except Exception as e:  # noqa: BLE001 - a codec or store of the user's own
            self._store_problem("entry kept in memory only, not stored", f"{type(e).__name__}: {e}")

    def _where(self) -> str:
        line = self._source_line(self._fn)
        return self._label if line is None else f"{self._label} ({line})"

    @staticmethod
    def _source_line(fn: Any) -> str | None:
        code = getattr(fn, "__code__", None)
        return None if code is None else f"{code.co_filename}:{code.co_firstlineno}"


_enable_vectorcall(Specialized)

_P = inspect.Parameter


def bind_call(sig: inspect.Signature, args: tuple, kwargs: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Bind a call to ``sig`` the way the interpreter binds a call to a function: positional
    arguments, keywords by name (a keyword named like a positional-only parameter goes to
    ``**kwargs``, which ``inspect.Signature.bind`` refuses before 3.12), defaults, ``*args`` as a
    tuple, ``**kwargs`` as a dict. Raises TypeError for a call the interpreter would reject."""
    params = list(sig.parameters.values())
    positional = [p for p in params if p.kind in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)]
    keyword_only = [p for p in params if p.kind is _P.KEYWORD_ONLY]
    var_pos = next((p for p in params if p.kind is _P.VAR_POSITIONAL), None)
    var_kw = next((p for p in params if p.kind is _P.VAR_KEYWORD), None)
    by_keyword = {p.name: p for p in params if p.kind in (_P.POSITIONAL_OR_KEYWORD, _P.KEYWORD_ONLY)}
    if len(args) > len(positional) and var_pos is None:
        raise TypeError(f"{name}() takes {len(positional)} positional arguments but {len(args)} were given")
    bound: dict[str, Any] = {p.name: v for p, v in zip(positional, args, strict=False)}  # extra args: *args
    extra: dict[str, Any] = {}
    for key, value in kwargs.items():
        if type(key) is not str:
            # The interpreter matches a str subclass by its own __eq__, in parameter order.
            key = next((name for name in by_keyword if key == name), key)
        if key in by_keyword:
            if key in bound:
                raise TypeError(f"{name}() got multiple values for argument '{key}'")
            bound[key] = value
        elif var_kw is not None:
            extra[key] = value
        else:
            raise TypeError(f"{name}() got an unexpected keyword argument '{key}'")
    for p in positional + keyword_only:
        if p.name not in bound:
            if p.default is _P.empty:
                raise TypeError(f"{name}() missing required argument: '{p.name}'")
            bound[p.name] = p.default
    if var_pos is not None:
        bound[var_pos.name] = tuple(args[len(positional) :])
    if var_kw is not None:
        bound[var_kw.name] = extra
    return {p.name: bound[p.name] for p in params}


@overload
def specialize(
    fn: Callable[_Args, _Ret],
    *,
    compiler: Compiler | None = None,
    backend: str | None = None,
    recompile_limit: int = 8,
    accumulated_limit: int = 256,
    on_limit: OnLimit = "raise",
    policy: Policy | None = None,
    error_on_recompile: bool = False,
    store: Store | None = None,
    codec: Codec | None = None,
) -> Specialized[_Args, _Ret]: ...
@overload
def specialize(
    fn: None = None,
    *,
    compiler: Compiler | None = None,
    backend: str | None = None,
    recompile_limit: int = 8,
    accumulated_limit: int = 256,
    on_limit: OnLimit = "raise",
    policy: Policy | None = None,
    error_on_recompile: bool = False,
    store: Store | None = None,
    codec: Codec | None = None,
) -> Callable[[Callable[_Args, _Ret]], Specialized[_Args, _Ret]]: ...
def specialize(
    fn: Callable[_Args, _Ret] | None = None,
    *,
    compiler: Compiler | None = None,
    backend: str | None = None,
    recompile_limit: int = 8,
    accumulated_limit: int = 256,
    on_limit: OnLimit = "raise",
    policy: Policy | None = None,
    error_on_recompile: bool = False,
    store: Store | None = None,
    codec: Codec | None = None,
) -> Specialized[_Args, _Ret] | Callable[[Callable[_Args, _Ret]], Specialized[_Args, _Ret]]:
    """Specialise ``fn`` on its arguments: compile on a miss, cache with guards, dispatch on a hit.

    Use as ``@specialize`` or ``@specialize(compiler=..., ...)``.

    Args:
        compiler: ``compiler(fn, example_args, builder) -> callable``. ``example_args`` is the
            call's ``f_locals``: a dict parameter name -> value, with defaults applied, ``*args``
            as a tuple and ``**kwargs`` as a dict (do not mutate it). ``builder`` is the
            :class:`tripwire.GuardBuilder` holding the inferred guards; the compiler may add
            guards (sources ``L['name']...`` and ``G['name']`` against ``fn.__globals__``). The
            returned callable is called with the original arguments on every hit; returning None
            (or anything not callable) raises TypeError. If the compiler raises, nothing is
            cached and the exception propagates with a note naming the function. Default: the
            function itself.
        backend: a label for this cache (one cache per function and backend); default the
            compiler's name.
        recompile_limit, accumulated_limit, on_limit: the :class:`tripwire.Cache` limits and
            policy: ``"raise"`` raises ``tripwire.RecompileLimitExceeded``, ``"fallback"`` runs
            the original function (uncached) once a limit is hit, ``"evict"`` drops the least
            recently used entry.
        policy: the :class:`tripwire.Policy` for inferred guards (value or type specialisation,
            per argument).
        error_on_recompile: raise :class:`tripwire.RecompileError` (with the reasons) instead of
            recompiling when the cache already has entries.
        store: where compiled entries persist (:class:`tripwire.store.Directory`, the default
            kind, or :class:`tripwire.store.Redis`); None (default) keeps them in memory only. A
            miss first loads the entries other processes stored (guards loaded with
            ``GuardSet.from_bytes``: references resolve against imported modules only) and
            compiles only when none matches; each new entry is stored. An entry whose guards or
            payload cannot be stored stays in memory, with one :class:`StoreWarning`.
        codec: turns payloads into bytes and back; default :class:`tripwire.store.ReferenceCodec`
            (a module-level object by name; never runs code from the data).
    """
    make: Callable[[Callable[_Args, _Ret]], Specialized[_Args, _Ret]] = functools.partial(
        Specialized,
        compiler=compiler,
        backend=backend,
        recompile_limit=recompile_limit,
        accumulated_limit=accumulated_limit,
        on_limit=on_limit,
        policy=policy,
        error_on_recompile=error_on_recompile,
        store=store,
        codec=codec,
    )
    return make if fn is None else make(fn)
