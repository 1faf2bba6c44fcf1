# A self-contained launcher: ddprun and ddprun_store_server link libstdc++, libgcc, spdlog, fmt
# and OpenSSL statically and need only the C library, so one binary runs on every current
# distribution (built on Debian 12: glibc 2.34 at most, tests/launcher/self_contained_test.sh).
#
# The choice is made per executable, not per library: ddprun's libraries (common, rendezvous,
# agent, ...) are compiled once, against spdlog and fmt in their compiled-library mode, and
# name their dependencies through the DDPRUN_*_LIBS lists below. Each list reads the property
# DDPRUN_STATIC_RUNTIME of the executable being linked: set (ddprun_self_contained()), it links
# our static spdlog and fmt (cmake/static_deps/, built from Debian's headers: Debian ships no
# static spdlog or fmt) and OpenSSL's archives; unset (every test, benchmark and LibTorch
# program), the shared libraries, as before. So no binary holds a static and a shared copy of
# one library, and the installed CMake package keeps naming spdlog::spdlog and fmt::fmt.
#
# DDPRUN_SELF_CONTAINED: AUTO (default) is ON unless the build has sanitizers or an archive is
# missing (the configure log names it; Debian 13's static libcrypto needs libzstd.a from
# libzstd-dev); ON insists (scripts/package); OFF links the launcher against the shared
# libraries. DDPRUN_SELF_CONTAINED_LAUNCHER holds the outcome.
set(DDPRUN_SELF_CONTAINED AUTO CACHE STRING
  "Link ddprun and ddprun_store_server statically against all but the C library: AUTO, ON or OFF")
set_property(CACHE DDPRUN_SELF_CONTAINED PROPERTY STRINGS AUTO ON OFF)
if(NOT DDPRUN_SELF_CONTAINED MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "DDPRUN_SELF_CONTAINED=${DDPRUN_SELF_CONTAINED}: not AUTO, ON or OFF")
endif()

find_package(OpenSSL REQUIRED)
set(DDPRUN_SELF_CONTAINED_LAUNCHER OFF)
set(self_contained_missing "")
if(NOT DDPRUN_SELF_CONTAINED STREQUAL "OFF")
  # OpenSSL's archives sit beside its shared libraries; what libcrypto.a needs in turn (zlib and
  # zstd on Debian 13) comes from pkg-config's static list and must be an archive too, except
  # the C library's own parts.
  get_filename_component(openssl_lib_dir "${OPENSSL_CRYPTO_LIBRARY}" DIRECTORY)
  set(openssl_static_names ssl crypto)
  find_package(PkgConfig QUIET)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(DDPRUN_OPENSSL_PC QUIET libssl libcrypto)
    list(APPEND openssl_static_names ${DDPRUN_OPENSSL_PC_STATIC_LIBRARIES})
    list(REMOVE_DUPLICATES openssl_static_names)
  endif()
  set(DDPRUN_OPENSSL_ARCHIVES "")
  foreach(name IN LISTS openssl_static_names)
    if(name MATCHES "^(c|m|dl|pthread|rt)$")
      continue()
    endif()
    find_library(DDPRUN_STATIC_LIB_${name} NAMES lib${name}.a HINTS "${openssl_lib_dir}")
    if(DDPRUN_STATIC_LIB_${name})
      list(APPEND DDPRUN_OPENSSL_ARCHIVES "${DDPRUN_STATIC_LIB_${name}}")
    else()
      list(APPEND self_contained_missing lib${name}.a)
    endif()
  endforeach()
  if(DDPRUN_SANITIZE AND DDPRUN_SELF_CONTAINED STREQUAL "AUTO")
    message(STATUS "ddprun: launcher linked against shared libraries (sanitizer build)")
  elseif(self_contained_missing)
    string(REPLACE ";" ", " self_contained_missing "${self_contained_missing}")
    if(DDPRUN_SELF_CONTAINED STREQUAL "ON")
      message(FATAL_ERROR "DDPRUN_SELF_CONTAINED=ON needs static archives not found here: ${self_contained_missing} "
        "(install their -dev packages, or configure with -DDDPRUN_SELF_CONTAINED=OFF)")
    endif()
    message(WARNING "ddprun: the launcher is linked against shared libraries: no ${self_contained_missing} "
      "(install their -dev packages for a self-contained ddprun)")
  else()
    set(DDPRUN_SELF_CONTAINED_LAUNCHER ON)
    message(STATUS "ddprun: self-contained launcher (static libstdc++, spdlog, fmt, OpenSSL)")
  endif()
endif()

if(DDPRUN_SELF_CONTAINED_LAUNCHER)
  set(static_deps ${CMAKE_CURRENT_LIST_DIR}/static_deps)
  # Third-party code: built without ddprun's warning set.
  add_library(ddprun_fmt_static STATIC ${static_deps}/fmt_format.cc)
  target_include_directories(ddprun_fmt_static SYSTEM PUBLIC $<TARGET_PROPERTY:fmt::fmt,INTERFACE_INCLUDE_DIRECTORIES>)
  add_library(ddprun_spdlog_static STATIC ${static_deps}/spdlog_core.cc ${static_deps}/spdlog_sinks.cc)
  target_include_directories(ddprun_spdlog_static SYSTEM
    PUBLIC $<TARGET_PROPERTY:spdlog::spdlog,INTERFACE_INCLUDE_DIRECTORIES>)
  # The same mode the shared library's users compile in (SPDLOG_SHARED_LIB aside, which only
  # sets symbol visibility), so that ddprun's objects link against either.
  target_compile_definitions(ddprun_spdlog_static PUBLIC SPDLOG_COMPILED_LIB SPDLOG_FMT_EXTERNAL)
  target_link_libraries(ddprun_spdlog_static PUBLIC ddprun_fmt_static Threads::Threads)

  add_library(ddprun_openssl_static INTERFACE)
  target_include_directories(ddprun_openssl_static SYSTEM INTERFACE ${OPENSSL_INCLUDE_DIR})
  target_link_libraries(ddprun_openssl_static INTERFACE ${DDPRUN_OPENSSL_ARCHIVES} ${CMAKE_DL_LIBS} Threads::Threads)
  add_library(ddprun_openssl_shared INTERFACE)
  target_link_libraries(ddprun_openssl_shared INTERFACE OpenSSL::SSL OpenSSL::Crypto)

  # Read on the executable being linked (or the target being compiled): see the top of this file.
  # Stand-ins for the two glibc 2.35+ functions the static GCC runtime calls (see the file).
  add_library(ddprun_glibc_compat OBJECT ${static_deps}/glibc_compat.cc)
  target_link_libraries(ddprun_glibc_compat PRIVATE ddprun_warnings)

  set(static_head "$<BOOL:$<TARGET_PROPERTY:DDPRUN_STATIC_RUNTIME>>")
  set(DDPRUN_SPDLOG_LIBS "$<BUILD_INTERFACE:$<IF:${static_head},ddprun_spdlog_static,spdlog::spdlog>>"
    "$<INSTALL_INTERFACE:spdlog::spdlog>")
  set(DDPRUN_FMT_LIBS "$<BUILD_INTERFACE:$<IF:${static_head},ddprun_fmt_static,fmt::fmt>>"
    "$<INSTALL_INTERFACE:fmt::fmt>")
  set(DDPRUN_OPENSSL_LIBS "$<IF:${static_head},ddprun_openssl_static,ddprun_openssl_shared>")
else()
  set(DDPRUN_SPDLOG_LIBS spdlog::spdlog)
  set(DDPRUN_FMT_LIBS fmt::fmt)
  set(DDPRUN_OPENSSL_LIBS OpenSSL::SSL OpenSSL::Crypto)
endif()

# Makes each executable named self-contained (when this build makes the launcher so): its
# DDPRUN_*_LIBS resolve to the static libraries, libstdc++ and libgcc are linked in with the
# glibc 2.34 stand-ins they need (static_deps/glibc_compat.cc), and a shared library it names
# but does not use (Boost.Filesystem, libdl) is dropped.
function(ddprun_self_contained)
  if(NOT DDPRUN_SELF_CONTAINED_LAUNCHER)
    return()
  endif()
  foreach(target IN LISTS ARGN)
    set_property(TARGET ${target} PROPERTY DDPRUN_STATIC_RUNTIME ON)
    # --gc-sections: unused functions of the archives go (a tenth of ddprun's size).
    target_link_options(${target} PRIVATE -static-libstdc++ -static-libgcc LINKER:--as-needed LINKER:--gc-sections
      LINKER:--wrap=_dl_find_object LINKER:--wrap=arc4random)
    target_link_libraries(${target} PRIVATE ddprun_glibc_compat)
  endforeach()
endfunction()
