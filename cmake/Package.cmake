# cpack -G DEB (scripts/package): two Debian packages from the install components.
#  - ddprun: the launcher. Its Depends come from dpkg-shlibdeps on the binaries, so they
#    name the shared libraries it really loads: libc alone for the self-contained launcher
#    (cmake/SelfContained.cmake), and never LibTorch: ddprun runs on hosts without torch.
#  - libddprun-dev: the runtime's static libraries, headers, CMake package and pkg-config
#    files, for building C++ workers; it depends on LibTorch's development package.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME ddprun)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "ddprun developers <ddprun-dev@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "native, torchrun-compatible launcher for distributed training")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_PACKAGE_DIRECTORY ${CMAKE_BINARY_DIR}/packages)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL launcher dev)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)

set(CPACK_DEBIAN_LAUNCHER_PACKAGE_NAME ddprun)
set(CPACK_DEBIAN_LAUNCHER_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_LAUNCHER_PACKAGE_SHLIBDEPS ON)
set(CPACK_COMPONENT_LAUNCHER_DESCRIPTION
  "ddprun launcher\n Starts the workers of a distributed PyTorch (or any) job on each node with torchrun's\n environment, meets the other nodes through a c10d-style TCP rendezvous, restarts workers\n on failure and re-forms the job when nodes leave or join. Needs no LibTorch.")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libddprun-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS
  "ddprun (= ${PROJECT_VERSION}), libtorch-dev, libspdlog-dev, libfmt-dev, zlib1g-dev, cmake | pkg-config")
set(CPACK_COMPONENT_DEV_DESCRIPTION
  "ddprun runtime for C++ workers (development files)\n Collectives over TCP and shared memory, DistributedDataParallel, checkpoints and RPC on\n LibTorch: static libraries, headers, a CMake package (find_package(ddprun)) and\n pkg-config files.")
include(CPack)
