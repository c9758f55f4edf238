// tripwire/cpp/runtime/eval/no_user_code.hpp -- marking regions that must run no user code.
//
// The fast pass and the tree walk's borrowed subtrees hold borrowed references and raw pointers
// on the promise that no user code runs until they end (docs/cpp.md, "Regions without user
// code"). On CPython 3.11 any allocation of a GC-tracked object can start a collection, which
// runs finalizers and weakref callbacks: user code. A region that allocates by mistake is
// usually silent (the freed memory still holds the right bytes), so debug builds check the
// promise itself: NoUserCodeRegion marks a region, and a gc callback and the engine's own weakref
// death callback abort the process, naming the region, when they run inside one.
//
// Release builds compile the markers to nothing.
#pragma once

#include "runtime/py.hpp"

namespace tripwire::runtime {

#ifdef TRIPWIRE_CHECK_REGIONS
/// Name of the innermost open region on this thread, or null.
extern thread_local const char* t_no_user_code_region;

/// RAII marker of a region without user code (nests: the outermost name is kept).
class NoUserCodeRegion {
  public:
    explicit NoUserCodeRegion(const char* name) : outer_(t_no_user_code_region) {
        if (outer_ == nullptr) t_no_user_code_region = name;
    }
    ~NoUserCodeRegion() { t_no_user_code_region = outer_; }
    NoUserCodeRegion(const NoUserCodeRegion&) = delete;
    NoUserCodeRegion& operator=(const NoUserCodeRegion&) = delete;

  private:
    const char* outer_;
};

/// RAII window inside a region where user code may run (the fast pass evaluating a residue in
/// place, its borrowed values held): the region is reopened when the window closes.
class UserCodeWindow {
  public:
    UserCodeWindow() : saved_(t_no_user_code_region) { t_no_user_code_region = nullptr; }
    ~UserCodeWindow() { t_no_user_code_region = saved_; }
    UserCodeWindow(const UserCodeWindow&) = delete;
    UserCodeWindow& operator=(const UserCodeWindow&) = delete;

  private:
    const char* saved_;
};

/// Abort with a message when called inside a region: `what` is the user code that would run.
void assert_outside_region(const char* what);

/// Append the checking callback to gc.callbacks (once). GIL held; false with an error set.
bool install_region_checks();
#else
class NoUserCodeRegion {
  public:
    explicit NoUserCodeRegion(const char*) {}
};
class UserCodeWindow {
  public:
    UserCodeWindow() {}  // NOLINT(modernize-use-equals-default): user-provided, so not "unused"
};
inline void assert_outside_region(const char*) {}
inline bool install_region_checks() { return true; }
#endif

/// Whether this build checks regions (debug builds).
constexpr bool kChecksRegions =
#ifdef TRIPWIRE_CHECK_REGIONS
    true;
#else
    false;
#endif

}  // namespace tripwire::runtime
