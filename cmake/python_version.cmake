# The CPython versions tripwire builds for. The engine mirrors private CPython layouts (interpreter
# frames, dict versions and hints: cpp/runtime/frame/interp_frame.hpp, cpp/runtime/eval/dict_hint.hpp)
# for exactly these versions, with the GIL; any other interpreter is refused here, with the reason,
# instead of being built into a module whose frame runtime cannot run.
# Keep in sync with requires-python and the classifiers in pyproject.toml
# (tests/python/package/test_packaging.py checks all three, and runs this file with `cmake -P`).
#
# Reads what find_package(Python) sets: Python_INTERPRETER_ID, Python_VERSION, Python_SOABI.
set(TRIPWIRE_PYTHON_MIN 3.11)
set(TRIPWIRE_PYTHON_END 3.14)  # the first version not supported
if(NOT Python_INTERPRETER_ID STREQUAL "Python"
   OR Python_VERSION VERSION_LESS TRIPWIRE_PYTHON_MIN
   OR NOT Python_VERSION VERSION_LESS TRIPWIRE_PYTHON_END
   OR Python_SOABI MATCHES "^cpython-[0-9]+t-")  # a free-threaded build: no GIL, other layouts
  message(FATAL_ERROR
    "tripwire supports CPython 3.11, 3.12 and 3.13 (with the GIL); this build found "
    "${Python_INTERPRETER_ID} ${Python_VERSION} (${Python_EXECUTABLE}, SOABI '${Python_SOABI}'). "
    "Build with a supported interpreter, for example `python3.13 -m pip install tripwire`.")
endif()
