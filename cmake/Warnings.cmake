# One warning set for all project targets; third-party headers come in as SYSTEM.
add_library(ddprun_warnings INTERFACE)
target_compile_options(ddprun_warnings INTERFACE -Wall -Wextra -Wpedantic -Wno-unused-parameter)

# Sanitizers for every target defined after this file: one of the values below, or a
# comma-separated mix of address, undefined, thread and leak (thread excludes the other two
# runtimes). The presets asan and tsan set it (CMakePresets.json; scripts/test --sanitize).
set(DDPRUN_SANITIZE "" CACHE STRING
  "Build with -fsanitize=<value>: address, undefined, thread, leak, or a comma-separated mix (address,undefined); empty: none")
set_property(CACHE DDPRUN_SANITIZE PROPERTY STRINGS "" address undefined "address,undefined" thread "thread,undefined" leak)
if(NOT DDPRUN_SANITIZE)
  # Build trees from before this was a string hold the old option's OFF: that means none.
  set_property(CACHE DDPRUN_SANITIZE PROPERTY TYPE STRING)
  set_property(CACHE DDPRUN_SANITIZE PROPERTY VALUE "")
else()
  string(REPLACE "," ";" ddprun_sanitizers "${DDPRUN_SANITIZE}")
  foreach(sanitizer IN LISTS ddprun_sanitizers)
    if(NOT sanitizer MATCHES "^(address|undefined|thread|leak)$")
      message(FATAL_ERROR "DDPRUN_SANITIZE=${DDPRUN_SANITIZE}: '${sanitizer}' is not a sanitizer ddprun builds with "
        "(address, undefined, thread, leak, or a comma-separated mix such as address,undefined)")
    endif()
  endforeach()
  if("thread" IN_LIST ddprun_sanitizers AND ("address" IN_LIST ddprun_sanitizers OR "leak" IN_LIST ddprun_sanitizers))
    message(FATAL_ERROR "DDPRUN_SANITIZE=${DDPRUN_SANITIZE}: thread cannot be combined with address or leak "
      "(the compiler has one runtime or the other); use two build trees (presets asan and tsan)")
  endif()
  add_compile_options(-fsanitize=${DDPRUN_SANITIZE} -fno-omit-frame-pointer)
  # Debian's GCC links with --as-needed, but not under -fsanitize (it keeps the sanitizer's
  # runtime with --no-as-needed of its own): without it here, ddprun would load libraries it
  # does not use, such as Boost.Filesystem, and fail its library test.
  add_link_options(-fsanitize=${DDPRUN_SANITIZE} LINKER:--as-needed)
  if("undefined" IN_LIST ddprun_sanitizers)
    # Undefined behaviour stops the process like the other sanitizers' findings do, so a test
    # that hits it fails instead of printing a line and passing. Without the vptr check: its
    # runtime opens a pipe to probe each new vtable, and a process out of descriptors (the
    # store's EMFILE tests, by design) then gets "invalid vptr" reports on sound objects.
    add_compile_options(-fno-sanitize-recover=undefined -fno-sanitize=vptr)
    add_link_options(-fno-sanitize=vptr)
  endif()
  message(STATUS "ddprun: building with -fsanitize=${DDPRUN_SANITIZE}")
endif()
