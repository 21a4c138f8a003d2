// Which sanitizer this translation unit is built with (CMake's RECAL_SANITIZE: the presets
// `asan`, `tsan`, `fuzz`), known at compile time: GCC defines __SANITIZE_ADDRESS__ and
// __SANITIZE_THREAD__ (which our CMake replaces by RECAL_TSAN), clang answers __has_feature.
// For the few places where a sanitizer runtime and the program disagree about the process
// (docs/testing.md, "Under sanitizers"), e.g. ASan's and TSan's shadow memory is terabytes of reserved
// address space, so no RLIMIT_AS can hold.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define RECAL_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RECAL_ASAN 1
#endif
#endif

#if defined(RECAL_TSAN)  // set by CMake, which undefines GCC's __SANITIZE_THREAD__ (CMakeLists.txt)
#elif defined(__SANITIZE_THREAD__)
#define RECAL_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RECAL_TSAN 1
#endif
#endif

namespace recal {

#if defined(RECAL_ASAN)
inline constexpr const char* kSanitizer = "AddressSanitizer";
#elif defined(RECAL_TSAN)
inline constexpr const char* kSanitizer = "ThreadSanitizer";
#else
inline constexpr const char* kSanitizer = nullptr;
#endif

// Under ASan or TSan, whose shadow memory is reserved address space.
inline constexpr bool kShadowMemorySanitizer = kSanitizer != nullptr;

}  // namespace recal
