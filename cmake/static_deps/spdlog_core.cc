// spdlog's compiled part, built here from the -inl.h headers Debian's libspdlog-dev ships: the
// distribution has no static libspdlog, and the self-contained launcher (cmake/SelfContained.cmake)
// must not load the shared one. This file does what spdlog's own src/spdlog.cpp and src/cfg.cpp
// do; spdlog_sinks.cc does the sinks. Compiled with SPDLOG_COMPILED_LIB and SPDLOG_FMT_EXTERNAL,
// as every ddprun translation unit is, so the objects of ddprun's libraries link against this
// archive or against libspdlog.so alike.
#ifndef SPDLOG_COMPILED_LIB
#error "spdlog_core.cc is spdlog's compiled library: build it with SPDLOG_COMPILED_LIB"
#endif

#include <mutex>

#include <spdlog/cfg/helpers-inl.h>
#include <spdlog/common-inl.h>
#include <spdlog/details/backtracer-inl.h>
#include <spdlog/details/log_msg-inl.h>
#include <spdlog/details/log_msg_buffer-inl.h>
#include <spdlog/details/null_mutex.h>
#include <spdlog/details/os-inl.h>
#include <spdlog/details/registry-inl.h>
#include <spdlog/logger-inl.h>
#include <spdlog/pattern_formatter-inl.h>
#include <spdlog/sinks/base_sink-inl.h>
#include <spdlog/sinks/sink-inl.h>
#include <spdlog/spdlog-inl.h>

// The templates whose definitions the headers leave out in compiled mode.
template SPDLOG_API spdlog::logger::logger(std::string name, sinks_init_list::iterator begin,
                                           sinks_init_list::iterator end);
template class SPDLOG_API spdlog::sinks::base_sink<std::mutex>;
template class SPDLOG_API spdlog::sinks::base_sink<spdlog::details::null_mutex>;
