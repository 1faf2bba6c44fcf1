# ccache, where installed (scripts/setup installs it): a rebuild in a fresh clone (CI, the
# demo) reuses earlier compiles. The cache lives outside the clone (ccache's own directory).
# BASEDIR and NOHASHDIR make hits independent of where the clone is; the sloppiness lets
# ccache cache translation units that use the LibTorch precompiled header.
find_program(DDPRUN_CCACHE_PROGRAM ccache)
option(DDPRUN_CCACHE "Compile through ccache when it is installed" ON)
if(DDPRUN_CCACHE AND DDPRUN_CCACHE_PROGRAM AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_CXX_COMPILER_LAUNCHER
    ${CMAKE_COMMAND} -E env CCACHE_BASEDIR=${PROJECT_SOURCE_DIR} CCACHE_NOHASHDIR=true
    "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
    ${DDPRUN_CCACHE_PROGRAM})
  message(STATUS "ddprun: compiling through ${DDPRUN_CCACHE_PROGRAM}")
endif()
