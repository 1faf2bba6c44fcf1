// Two glibc functions newer than 2.34 that the static GCC runtime calls, replaced for the
// self-contained launcher (cmake/SelfContained.cmake) so that it runs on glibc 2.34, the oldest
// of the distributions PyTorch users run (RHEL 9, Ubuntu 22.04 has 2.35). GCC's libgcc_eh.a and
// libstdc++.a were built against Debian 12's glibc 2.36, and linked in statically they reference:
//  - _dl_find_object (GLIBC_2.35): the unwinder's lookup of a return address's unwind tables,
//    on every frame an exception passes;
//  - arc4random (GLIBC_2.36): std::random_device's "arc4random" source, and its fallback when
//    /dev/urandom cannot be opened.
// The link wraps both (-Wl,--wrap=NAME sends the static runtime's calls to __wrap_NAME) to the
// equivalents below, built on functions glibc has had for years: dl_iterate_phdr (what libgcc
// itself used before glibc 2.35) and getrandom (2.25). The shared libraries' own calls and the
// rest of glibc are untouched.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <sys/random.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

// glibc 2.35's headers declare struct dl_find_object; GCC's unwinder calls _dl_find_object only
// when they do (DLFO_STRUCT_HAS_EH_DBASE is its test too).
#ifdef DLFO_STRUCT_HAS_EH_DBASE
#if DLFO_STRUCT_HAS_EH_DBASE
// i386 and a few others give unwind tables a data base (dlfo_eh_dbase), which x86-64 and
// aarch64 do not; it is not filled in below.
#error "glibc_compat.cc: _dl_find_object's dlfo_eh_dbase is not provided on this architecture"
#endif
namespace {

struct FindObject {
  uintptr_t pc;
  dl_find_object* result;
  bool found;
};

// dl_iterate_phdr's callback: stops (returns 1) at the loaded object one of whose PT_LOAD
// segments holds the address, and describes it as _dl_find_object does.
int findObject(dl_phdr_info* info, size_t, void* data) {
  auto* search = static_cast<FindObject*>(data);
  bool holds = false;
  uintptr_t start = UINTPTR_MAX, end = 0;
  void* eh_frame = nullptr;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& segment = info->dlpi_phdr[i];
    uintptr_t begin = info->dlpi_addr + segment.p_vaddr;
    if (segment.p_type == PT_LOAD) {
      holds = holds || (search->pc >= begin && search->pc < begin + segment.p_memsz);
      start = begin < start ? begin : start;
      end = begin + segment.p_memsz > end ? begin + segment.p_memsz : end;
    } else if (segment.p_type == PT_GNU_EH_FRAME) {
      eh_frame = reinterpret_cast<void*>(begin);
    }
  }
  if (!holds) return 0;
  std::memset(search->result, 0, sizeof(*search->result));
  search->result->dlfo_map_start = reinterpret_cast<void*>(start);
  search->result->dlfo_map_end = reinterpret_cast<void*>(end);
  // dlfo_link_map stays null: the unwinder, the only caller, reads the unwind tables alone.
  search->result->dlfo_eh_frame = eh_frame;
  search->found = true;
  return 1;
}

}  // namespace

// Returns 0 and describes the object mapped at `pc`, or -1 if none is, as glibc's does.
extern "C" int __wrap__dl_find_object(void* pc, dl_find_object* result) {
  FindObject search{reinterpret_cast<uintptr_t>(pc), result, false};
  dl_iterate_phdr(findObject, &search);
  return search.found ? 0 : -1;
}
#endif  // DLFO_STRUCT_HAS_EH_DBASE

// Four random bytes from the kernel; never fails (it aborts, as glibc's does, when the system
// has no randomness to give at all).
extern "C" uint32_t __wrap_arc4random() {
  int saved_errno = errno;
  uint32_t value = 0;
  auto* bytes = reinterpret_cast<unsigned char*>(&value);
  size_t got = 0;
  while (got < sizeof(value)) {
    ssize_t n = getrandom(bytes + got, sizeof(value) - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      break;
    }
  }
  if (got < sizeof(value)) {
    // A kernel without getrandom (before 3.17): the device, as glibc falls back to.
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    while (fd >= 0 && got < sizeof(value)) {
      ssize_t n = read(fd, bytes + got, sizeof(value) - got);
      if (n > 0) {
        got += static_cast<size_t>(n);
      } else if (n == 0 || errno != EINTR) {
        break;
      }
    }
    if (fd >= 0) close(fd);
  }
  if (got < sizeof(value)) {
    std::fputs("ddprun: arc4random: no randomness from getrandom or /dev/urandom\n", stderr);
    std::abort();
  }
  errno = saved_errno;
  return value;
}
