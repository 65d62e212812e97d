// Clang thread-safety annotations (checked with -Wthread-safety under clang; no-ops elsewhere).
#pragma once

#if defined(__clang__)
#define TRYBOX_TSA(x) __attribute__((x))
#else
#define TRYBOX_TSA(x)
#endif

#define GUARDED_BY(x) TRYBOX_TSA(guarded_by(x))
#define PT_GUARDED_BY(x) TRYBOX_TSA(pt_guarded_by(x))
#define REQUIRES(...) TRYBOX_TSA(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) TRYBOX_TSA(locks_excluded(__VA_ARGS__))
