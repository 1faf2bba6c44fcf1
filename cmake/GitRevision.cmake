# Run at build time (cmake -P): writes OUT with the short git revision of SOURCE_DIR, "+dirty"
# when the tree has uncommitted changes, or "" outside a git checkout (a source tarball).
# The file is rewritten only when its text changes, so an unchanged revision rebuilds nothing.
execute_process(COMMAND git -C "${SOURCE_DIR}" rev-parse --short=12 HEAD
  OUTPUT_VARIABLE revision OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE failed ERROR_QUIET)
if(failed)
  set(revision "")
else()
  execute_process(COMMAND git -C "${SOURCE_DIR}" status --porcelain --untracked-files=no
    OUTPUT_VARIABLE changes ERROR_QUIET)
  if(changes)
    string(APPEND revision "+dirty")
  endif()
endif()
set(text "#pragma once\n#define DDPRUN_GIT_REVISION \"${revision}\"\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT "${old}" STREQUAL "${text}")
  file(WRITE "${OUT}" "${text}")
endif()
