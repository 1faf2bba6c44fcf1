#include "worker_runtime/error_record.h"

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <fstream>
#include <memory>
#include <typeinfo>

#include <cxxabi.h>

#include <fmt/format.h>

#include "common/env_names.h"
#include "common/env_reader.h"
#include "common/json_writer.h"

namespace ddprun::runtime {

bool writeErrorFile(const std::string& message, const std::string& traceback) {
  const auto path = env::optionalString(env::kErrorFile);
  if (!path) return false;
  std::ofstream out(*path, std::ios::trunc);
  out << fmt::format(R"({{"message": {{"message": {}, "extraInfo": {{"py_callstack": {}, "timestamp": "{}"}}}}}})",
                     jsonString(message), jsonString(traceback), static_cast<long long>(std::time(nullptr)));
  out.close();
  return static_cast<bool>(out);
}

namespace {

std::string demangledTypeName(const std::exception& e) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name(abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status),
                                              std::free);
  return status == 0 && name ? name.get() : typeid(e).name();
}

}  // namespace

int recordErrors(const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::string message = fmt::format("{}: {}", demangledTypeName(e), e.what());
    std::fprintf(stderr, "%s\n", message.c_str());
    writeErrorFile(message, "(C++ exception escaped main)");
    return 1;
  }
}

}  // namespace ddprun::runtime
