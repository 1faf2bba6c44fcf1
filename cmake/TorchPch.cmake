# LibTorch's headers are most of the compile time of every translation unit that includes
# them (20-55 s each on 2 cores). They are parsed once, into one precompiled header that every
# target linking LibTorch reuses. Call ddprun_reuse_torch_pch() after all targets exist.
option(DDPRUN_TORCH_PCH "Precompile LibTorch's headers once for all LibTorch targets" ON)

if(Torch_FOUND AND DDPRUN_TORCH_PCH)
  add_library(ddprun_torch_pch STATIC ${CMAKE_CURRENT_LIST_DIR}/torch_pch.cc)
  # Same flags as its users, -Wpedantic included (it changes the predefined macros GCC checks).
  target_link_libraries(ddprun_torch_pch PUBLIC ${TORCH_LIBRARIES} PRIVATE ddprun_warnings)
  target_include_directories(ddprun_torch_pch SYSTEM PRIVATE ${TORCH_INCLUDE_DIRS})
  target_compile_options(ddprun_torch_pch PRIVATE ${TORCH_CXX_FLAGS})
  # ATen alone: a PCH of all of <torch/torch.h> is 780 MB and loading it costs more than it saves.
  target_precompile_headers(ddprun_torch_pch PRIVATE <ATen/ATen.h>)
  # ccache needs the PCH named in the preprocessed output to hash it (it changes nothing else).
  target_compile_options(ddprun_torch_pch PRIVATE -fpch-preprocess)
endif()

# Every target (in any directory below DIR) is a list entry of OUT.
function(ddprun_all_targets dir out)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(subdir IN LISTS subdirs)
    ddprun_all_targets(${subdir} more)
    list(APPEND targets ${more})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

# The targets that link LibTorch directly or through one of our LibTorch libraries share the
# precompiled header; the others (the launcher side) never see it.
function(ddprun_reuse_torch_pch)
  if(NOT TARGET ddprun_torch_pch)
    return()
  endif()
  set(torch_users ddprun::dist ddprun_dist ddprun::ddp ddprun::rpc ddprun::checkpoint ddprun_trainer_support
      ${TORCH_LIBRARIES})
  ddprun_all_targets(${PROJECT_SOURCE_DIR} targets)
  foreach(target IN LISTS targets)
    get_target_property(type ${target} TYPE)
    if(target STREQUAL "ddprun_torch_pch" OR NOT type MATCHES "^(EXECUTABLE|STATIC_LIBRARY|SHARED_LIBRARY|OBJECT_LIBRARY)$")
      continue()
    endif()
    get_target_property(links ${target} LINK_LIBRARIES)
    foreach(link IN LISTS links)
      if(link IN_LIST torch_users)
        target_precompile_headers(${target} REUSE_FROM ddprun_torch_pch)
        target_compile_options(${target} PRIVATE -fpch-preprocess)
        break()
      endif()
    endforeach()
  endforeach()
endfunction()
