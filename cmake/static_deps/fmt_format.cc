// fmt's compiled part (what fmt's own src/format.cc holds), built from the format-inl.h that
// Debian's libfmt-dev ships: the distribution has no static libfmt, and the self-contained
// launcher (cmake/SelfContained.cmake) must not load the shared one. Without FMT_HEADER_ONLY,
// format-inl.h defines its functions out of line, here, once; the explicit instantiations below
// are the templates that format.h declares extern. Nothing of ddprun uses fmt/os.h, so fmt's
// os.cc has no counterpart here.
#include <fmt/format-inl.h>

FMT_BEGIN_NAMESPACE
namespace detail {

template FMT_API auto dragonbox::to_decimal(float x) noexcept -> dragonbox::decimal_fp<float>;
template FMT_API auto dragonbox::to_decimal(double x) noexcept -> dragonbox::decimal_fp<double>;

#ifndef FMT_STATIC_THOUSANDS_SEPARATOR
template FMT_API locale_ref::locale_ref(const std::locale& loc);
template FMT_API auto locale_ref::get<std::locale>() const -> std::locale;
#endif

template FMT_API auto thousands_sep_impl(locale_ref) -> thousands_sep_result<char>;
template FMT_API auto decimal_point_impl(locale_ref) -> char;
template FMT_API void buffer<char>::append(const char*, const char*);
// fmt 10 declares this one extern in format.h; fmt 9 exports it from the shared library too.
#if FMT_VERSION >= 100000
template FMT_API void vformat_to(buffer<char>&, string_view, typename vformat_args<>::type, locale_ref);
#else
template FMT_API void vformat_to(buffer<char>&, string_view, basic_format_args<FMT_BUFFER_CONTEXT(char)>, locale_ref);
#endif

template FMT_API auto thousands_sep_impl(locale_ref) -> thousands_sep_result<wchar_t>;
template FMT_API auto decimal_point_impl(locale_ref) -> wchar_t;
template FMT_API void buffer<wchar_t>::append(const wchar_t*, const wchar_t*);

}  // namespace detail
FMT_END_NAMESPACE
