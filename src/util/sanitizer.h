// TRYBOX_ASAN is defined in a build under AddressSanitizer, by clang (__has_feature) or GCC
// (__SANITIZE_ADDRESS__): for the few places whose code or expectations differ there.
#pragma once

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TRYBOX_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(TRYBOX_ASAN)
#define TRYBOX_ASAN 1
#endif
