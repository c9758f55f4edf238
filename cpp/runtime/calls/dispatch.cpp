// tripwire/cpp/runtime/calls/dispatch.cpp -- dispatch().
#include "runtime/calls/dispatch.hpp"

namespace tripwire::runtime {

DispatchOutcome dispatch(Cache& cache, const CallSignature& sig, PyObject* fn, PyObject* const* args,
                         Py_ssize_t nargs, PyObject* kwnames, BoundCall& bound, Ref& payload) {
    const int b = bound.bind(sig, fn, args, nargs, kwnames);
    if (b < 0) return DispatchOutcome::Error;
    if (b == 0) return DispatchOutcome::NotBound;
    const Locals locals = bound.locals();
    if (cache.lookup_most_recent(locals, payload) == 1) {
        if (payload.get() != Py_None) return DispatchOutcome::Hit;
        payload = Ref();
        return DispatchOutcome::Miss;
    }
    EntryPtr e;
    if (!cache.lookup(locals, e)) return DispatchOutcome::Error;
    if (!e || e->payload.get() == Py_None) return DispatchOutcome::Miss;
    payload = e->payload;  // our own reference: the entry may be evicted by the payload itself
    return DispatchOutcome::Hit;
}

}  // namespace tripwire::runtime
