// Clang thread-safety annotations (checked with -Wthread-safety under clang; no-ops elsewhere).
// Use them with trybox::Mutex (util/mutex.h): std::mutex in libstdc++ is not annotated.
#pragma once

#if defined(__clang__)
#define TRYBOX_TSA(x) __attribute__((x))
#else
#define TRYBOX_TSA(x)
#endif

#define CAPABILITY(x) TRYBOX_TSA(capability(x))
#define SCOPED_CAPABILITY TRYBOX_TSA(scoped_lockable)
#define GUARDED_BY(x) TRYBOX_TSA(guarded_by(x))
#define PT_GUARDED_BY(x) TRYBOX_TSA(pt_guarded_by(x))
#define REQUIRES(...) TRYBOX_TSA(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) TRYBOX_TSA(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) TRYBOX_TSA(acquire_capability(__VA_ARGS__))
#define RELEASE(...) TRYBOX_TSA(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) TRYBOX_TSA(try_acquire_capability(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) TRYBOX_TSA(assert_capability(x))
#define RETURN_CAPABILITY(x) TRYBOX_TSA(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS TRYBOX_TSA(no_thread_safety_analysis)
