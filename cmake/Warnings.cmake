# One warning set for all project targets; third-party headers come in as SYSTEM.
add_library(ddprun_warnings INTERFACE)
target_compile_options(ddprun_warnings INTERFACE -Wall -Wextra -Wpedantic -Wno-unused-parameter)

option(DDPRUN_SANITIZE "Build with -fsanitize=<value> (address, thread, undefined)" "")
if(DDPRUN_SANITIZE)
  add_compile_options(-fsanitize=${DDPRUN_SANITIZE} -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${DDPRUN_SANITIZE})
endif()
