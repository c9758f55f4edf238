"""Shared fixtures for the Python test suite, and the ``--gc-stress`` mode (gc_stress.py)."""

from __future__ import annotations

import gc

import pytest

import gc_stress
from gc_stress import SuiteStress

_STRESS = pytest.StashKey[SuiteStress]()


def pytest_configure(config: pytest.Config) -> None:
    # Before test modules are imported: they scale long loops with gc_stress.scaled().
    gc_stress.ACTIVE = bool(config.getoption("--gc-stress"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--gc-stress",
        action="store_true",
        default=False,
        help="run every test with gc.set_threshold(1) and a self-re-arming finalizer in a reference "
        "cycle that mutates state on every collection (tests/python/support/gc_stress.py)",
    )


@pytest.fixture(scope="session")
def _suite_stress(request: pytest.FixtureRequest):
    if not request.config.getoption("--gc-stress"):
        yield None
        return
    import tripwire as tw

    stress = SuiteStress()
    request.config.stash[_STRESS] = stress
    original_init = tw.Cache.__init__

    def registering_init(self, *args, **kwargs):  # every Cache the tests make is purged mid-check
        original_init(self, *args, **kwargs)
        stress.caches.add(self)

    tw.Cache.__init__ = registering_init
    try:
        yield stress
    finally:
        tw.Cache.__init__ = original_init


@pytest.fixture(autouse=True)
def _gc_per_test(_suite_stress):
    """Each test starts with what earlier tests left alive frozen (gc.freeze), so a full
    collection inside it scans only the objects it makes: the suite's heap grows as it runs
    (compiled models, Dynamo's state), and a test that collects inside a check pays for the heap
    on every collection (about a second each by the middle of the suite). Everything the test
    creates stays collectable, so its finalizers and weakref callbacks run exactly as before; the
    frozen objects are unfrozen after it. In --gc-stress mode the test also runs under
    SuiteStress (collections everywhere), whose finalizer cycle is made after the freeze."""
    gc.freeze()
    try:
        if _suite_stress is None:
            yield
            return
        _suite_stress.start()
        try:
            yield
        finally:
            _suite_stress.stop()
    finally:
        gc.unfreeze()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what exists once every test module is imported (torch, numpy, the modules' own
    objects): a full collection then scans only what the tests make. With torch imported a full
    gc.collect() walks ~170,000 objects (about 100-400 ms here), and the re-entrancy tests run
    thousands of them; frozen, one costs microseconds. Nothing a test creates is frozen, so every
    finalizer and weakref callback the tests arm still runs exactly as before."""
    gc.collect()
    gc.freeze()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # Frozen objects are never collected, not even at exit: a module-level cycle through a
    # nanobind object (a @specialize'd function and its module's globals) would then outlive the
    # interpreter, and nanobind reports it as a leak.
    gc.unfreeze()


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    stress = config.stash.get(_STRESS, None)
    if stress is not None:
        terminalreporter.write_line(
            f"gc-stress: {stress.collections} collections ran the mutating finalizer "
            f"(gc.set_threshold(1) in every test)"
        )


@pytest.fixture
def collect():
    """Run a full garbage collection (objects freed between build and check)."""

    def run() -> None:
        for _ in range(3):
            gc.collect()

    return run
