# cmake --install: the launcher (component "launcher": ddprun, the store server, ddprun-slurm)
# and the runtime for C++ workers (component "dev": static libraries, headers under
# include/ddprun/, a CMake package with ddprun::dist, ::ddp, ::checkpoint, ::rpc, and
# pkg-config files). scripts/package turns the two components into .deb files.
include(CMakePackageConfigHelpers)
set(DDPRUN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/ddprun)
# Installing (and cpack) takes what is built; scripts/package builds ddprun_installables
# first rather than every test and bench.
set(CMAKE_SKIP_INSTALL_ALL_DEPENDENCY ON)

ddprun_self_contained(ddprun ddprun_store_server)
install(TARGETS ddprun ddprun_store_server RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT launcher)
# The launcher is installed stripped (10 MB, not 150 MB with the line tables) by every route,
# --strip or not; a Debug build keeps its symbols.
if(CMAKE_STRIP)
  install(CODE "
    if(NOT CMAKE_INSTALL_CONFIG_NAME STREQUAL \"Debug\")
      foreach(program ddprun ddprun_store_server)
        execute_process(COMMAND \"${CMAKE_STRIP}\"
          \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}/\${program}\" COMMAND_ERROR_IS_FATAL ANY)
      endforeach()
    endif()" COMPONENT launcher)
endif()
install(PROGRAMS scripts/ddprun-slurm DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT launcher)

set(runtime_targets ddprun_warnings ddprun_common ddprun_store ddprun_worker_runtime)
if(Torch_FOUND)
  list(APPEND runtime_targets ddprun_dist ddprun_ddp ddprun_checkpoint ddprun_rpc)
endif()
foreach(target IN LISTS runtime_targets)
  # ddprun_dist is ddprun::dist to its users, in the tree and installed alike.
  string(REGEX REPLACE "^ddprun_" "" export_name ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${export_name})
endforeach()
add_custom_target(ddprun_installables)
add_dependencies(ddprun_installables ddprun ddprun_store_server ${runtime_targets})
install(TARGETS ${runtime_targets} EXPORT ddprunTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
# Headers keep their paths from the project root ("worker_runtime/distributed.h"), which
# include each other that way.
# Of rendezvous/, only the store (ddprun_store) is the workers': the rounds, the job board and
# the backends are the agent's (not installed) and their headers stay out; so do the *_impl.h
# headers, a library's insides shared by its own .cc files.
install(DIRECTORY common worker_runtime DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ddprun
  COMPONENT dev FILES_MATCHING PATTERN "*.h" PATTERN "*_impl.h" EXCLUDE)
install(DIRECTORY rendezvous/store DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ddprun/rendezvous
  COMPONENT dev FILES_MATCHING PATTERN "*.h" PATTERN "*_impl.h" EXCLUDE)
install(EXPORT ddprunTargets NAMESPACE ddprun:: FILE ddprunTargets.cmake DESTINATION ${DDPRUN_CMAKE_DIR}
  COMPONENT dev)

set(DDPRUN_WITH_TORCH ${Torch_FOUND})
configure_package_config_file(cmake/templates/ddprunConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/ddprunConfig.cmake INSTALL_DESTINATION ${DDPRUN_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/ddprunConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/ddprunConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/ddprunConfigVersion.cmake
  DESTINATION ${DDPRUN_CMAKE_DIR} COMPONENT dev)

# pkg-config: ddprun-runtime (no LibTorch: env contract, store client, transports and
# collectives on raw buffers) and, with LibTorch, ddprun (dist, ddp, checkpoint, rpc).
set(pc_dir ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
file(RELATIVE_PATH pc_to_prefix ${CMAKE_INSTALL_PREFIX}/${pc_dir} ${CMAKE_INSTALL_PREFIX})
set(DDPRUN_PC_PREFIX "\${pcfiledir}/${pc_to_prefix}")
configure_file(cmake/templates/ddprun-runtime.pc.in ${CMAKE_CURRENT_BINARY_DIR}/ddprun-runtime.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/ddprun-runtime.pc DESTINATION ${pc_dir} COMPONENT dev)
if(Torch_FOUND)
  # LibTorch ships no .pc file: name its include directories and libraries here.
  set(DDPRUN_PC_TORCH_CFLAGS "")
  foreach(dir IN LISTS TORCH_INCLUDE_DIRS)
    string(APPEND DDPRUN_PC_TORCH_CFLAGS " -I${dir}")
  endforeach()
  string(APPEND DDPRUN_PC_TORCH_CFLAGS " ${TORCH_CXX_FLAGS}")
  get_target_property(torch_location torch IMPORTED_LOCATION)
  if(NOT torch_location)
    get_target_property(torch_configs torch IMPORTED_CONFIGURATIONS)
    list(GET torch_configs 0 torch_config)
    get_target_property(torch_location torch IMPORTED_LOCATION_${torch_config})
  endif()
  get_filename_component(torch_libdir ${torch_location} DIRECTORY)
  set(DDPRUN_PC_TORCH_LIBS "-L${torch_libdir} -Wl,-rpath,${torch_libdir} -ltorch -ltorch_cpu -lc10")
  configure_file(cmake/templates/ddprun.pc.in ${CMAKE_CURRENT_BINARY_DIR}/ddprun.pc @ONLY)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/ddprun.pc DESTINATION ${pc_dir} COMPONENT dev)
endif()
