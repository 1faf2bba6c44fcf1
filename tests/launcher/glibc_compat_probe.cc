// Checks the self-contained launcher's glibc stand-ins (cmake/static_deps/glibc_compat.cc) in a
// program linked as ddprun is (ddprun_self_contained): the unwinder's _dl_find_object answers as
// glibc's own does for the program, for libc and for an address no object maps, an exception
// crosses a libc frame (qsort's) to its handler, and std::random_device's arc4random source
// draws from the kernel. Reports by exit status: 0, or 1 with one line per failed check.
#include <dlfcn.h>
#include <link.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <set>
#include <stdexcept>
#include <string>

extern "C" uint32_t __wrap_arc4random();
// The stand-in exists where glibc's headers have _dl_find_object (2.35+), and so does the real
// one to compare with: this probe runs where it was built.
#ifdef DLFO_STRUCT_HAS_EH_DBASE
extern "C" int __wrap__dl_find_object(void* pc, dl_find_object* result);
extern "C" int __real__dl_find_object(void* pc, dl_find_object* result);
#endif

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
    ++failures;
  }
}

#ifdef DLFO_STRUCT_HAS_EH_DBASE
void sameAsGlibc(void* pc, const char* name) {
  dl_find_object ours{}, glibcs{};
  int ours_rc = __wrap__dl_find_object(pc, &ours);
  int glibc_rc = __real__dl_find_object(pc, &glibcs);
  check(ours_rc == glibc_rc,
        std::string(name) + ": returned " + std::to_string(ours_rc) + ", glibc " + std::to_string(glibc_rc));
  if (ours_rc != 0 || glibc_rc != 0) return;
  check(ours.dlfo_eh_frame != nullptr, std::string(name) + ": no unwind tables found");
  check(ours.dlfo_eh_frame == glibcs.dlfo_eh_frame, std::string(name) + ": unwind tables differ from glibc's");
  check(ours.dlfo_map_start == glibcs.dlfo_map_start && ours.dlfo_map_end == glibcs.dlfo_map_end,
        std::string(name) + ": mapping differs from glibc's");
}

#endif

int compareThrowing(const void* a, const void* b) {
  if (*static_cast<const int*>(a) != *static_cast<const int*>(b)) throw std::runtime_error("from inside qsort");
  return 0;
}

}  // namespace

int main() {
#ifdef DLFO_STRUCT_HAS_EH_DBASE
  sameAsGlibc(reinterpret_cast<void*>(&compareThrowing), "the program's own function");
  sameAsGlibc(reinterpret_cast<void*>(&std::qsort), "libc's qsort");
  int on_stack = 0;
  dl_find_object none{};
  check(__wrap__dl_find_object(&on_stack, &none) == -1, "a stack address was found in a loaded object");
#endif

  // qsort is C; glibc's unwind tables let the exception through it (found by the stand-in).
  int values[] = {2, 1};
  bool caught = false;
  try {
    std::qsort(values, 2, sizeof(int), compareThrowing);
  } catch (const std::runtime_error&) {
    caught = true;
  }
  check(caught, "an exception thrown through qsort was not caught");

  try {
    std::random_device device("arc4random");
    std::set<unsigned> drawn;
    for (int i = 0; i < 16; ++i) drawn.insert(device());
    check(drawn.size() > 1, "random_device(\"arc4random\") drew 16 equal values");
  } catch (const std::exception& e) {
    check(false, std::string("random_device(\"arc4random\"): ") + e.what());
  }
  std::set<uint32_t> direct;
  for (int i = 0; i < 16; ++i) direct.insert(__wrap_arc4random());
  check(direct.size() > 1, "the arc4random stand-in returned 16 equal values");
  if (failures == 0) std::puts("ok: the glibc stand-ins answer as glibc does");
  return failures == 0 ? 0 : 1;
}
