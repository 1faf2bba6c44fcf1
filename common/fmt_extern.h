// fmt 9 compiles detail::vformat_to<char>, its whole formatting engine, into libfmt (and into
// cmake/static_deps/fmt_format.cc for the self-contained launcher) but does not declare it
// extern: every translation unit that logged through spdlog (whose log calls go straight to
// it) instantiated and optimised it again, about 5 s of a 7 s compile on 2 cores, 130 times
// over in the launcher alone. Declared extern here, each unit calls the library's copy. fmt
// 10 and later declare it themselves.
#pragma once

#include <fmt/format.h>

#if FMT_VERSION < 100000 && !defined(FMT_HEADER_ONLY)
FMT_BEGIN_NAMESPACE
namespace detail {
extern template FMT_API void vformat_to<char>(buffer<char>&, basic_string_view<char>,
                                              basic_format_args<FMT_BUFFER_CONTEXT(char)>, locale_ref);
}  // namespace detail
FMT_END_NAMESPACE
#endif
