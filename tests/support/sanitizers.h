// Whether this test binary was built with AddressSanitizer or ThreadSanitizer (the asan and
// tsan presets), for the few checks that measure the process itself rather than the code under
// test: those sanitizers' allocators keep freed memory resident for a while (the quarantine)
// and map shadow memory in proportion to the heap, so a bound on the resident set that holds
// in a plain build does not hold there. Everything else is checked the same in every build.
#pragma once

namespace ddprun::testing {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)  // GCC
inline constexpr bool kSanitizedHeap = true;
#elif defined(__has_feature)  // Clang
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
inline constexpr bool kSanitizedHeap = true;
#else
inline constexpr bool kSanitizedHeap = false;
#endif
#else
inline constexpr bool kSanitizedHeap = false;
#endif

}  // namespace ddprun::testing
