# Unity builds of the libraries behind ddprun and fashion_mnist (DDPRUN_UNITY, off by default;
# scripts/demo turns it on). Each launcher-side translation unit spends most of its 5-14 s
# re-reading the same Boost.Asio, spdlog, fmt and CLI11 headers and re-instantiating their
# templates, each LibTorch one the torch headers beyond the precompiled ATen; compiled as one
# file per batch of up to DDPRUN_UNITY_BATCH sources, a library reads them once. It is for
# builds made once (a fresh machine's demo): an edit recompiles its whole batch, so a
# developer's incremental build gets slower, hence off by default.
# Tests, benchmarks, executables and the other libraries keep one object per source either way.
option(DDPRUN_UNITY "Compile the demo's libraries as unity batches (faster from scratch, slower incremental)" OFF)
set(DDPRUN_UNITY_BATCH 16 CACHE STRING "Sources per unity batch under DDPRUN_UNITY")

# The project's own static libraries that TARGET links, directly or through another, in OUT.
function(ddprun_linked_libraries target out)
  set(found "")
  set(queue ${target})
  while(queue)
    list(POP_FRONT queue current)
    get_target_property(links ${current} LINK_LIBRARIES)
    foreach(link IN LISTS links)
      if(NOT TARGET "${link}")
        continue()  # a system library, a flag or a generator expression
      endif()
      get_target_property(real ${link} ALIASED_TARGET)
      if(real)
        set(link ${real})
      endif()
      get_target_property(imported ${link} IMPORTED)
      get_target_property(type ${link} TYPE)
      if(imported OR NOT type MATCHES "^(STATIC_LIBRARY|OBJECT_LIBRARY)$" OR link IN_LIST found)
        continue()
      endif()
      list(APPEND found ${link})
      list(APPEND queue ${link})
    endforeach()
  endwhile()
  set(${out} ${found} PARENT_SCOPE)
endfunction()

# Call after all targets exist. Only ddprun's own sources (cmake/static_deps' copies of spdlog
# and fmt, and the torch PCH's library, stay as they are).
function(ddprun_enable_unity)
  if(NOT DDPRUN_UNITY)
    return()
  endif()
  set(libraries "")
  foreach(program ddprun fashion_mnist)
    if(TARGET ${program})
      ddprun_linked_libraries(${program} more)
      list(APPEND libraries ${more})
    endif()
  endforeach()
  list(REMOVE_DUPLICATES libraries)
  foreach(library IN LISTS libraries)
    get_target_property(dir ${library} SOURCE_DIR)
    file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${dir})
    if(rel MATCHES "^(common|rendezvous|agent|launcher|worker_runtime|trainers)(/|$)")
      set_target_properties(${library} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${DDPRUN_UNITY_BATCH})
    endif()
  endforeach()
endfunction()
