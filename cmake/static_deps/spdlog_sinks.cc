// spdlog's console, file and asynchronous sinks, compiled from Debian's -inl.h headers (what
// spdlog's own src/color_sinks.cpp, stdout_sinks.cpp, file_sinks.cpp and async.cpp do): the
// second half of the static spdlog that spdlog_core.cc begins. The registry's default logger
// writes through the colour console sink, so the launcher needs these even though its own
// sink is a base_sink.
#ifndef SPDLOG_COMPILED_LIB
#error "spdlog_sinks.cc is spdlog's compiled library: build it with SPDLOG_COMPILED_LIB"
#endif

#include <mutex>

#include <spdlog/async.h>
#include <spdlog/async_logger-inl.h>
#include <spdlog/details/file_helper-inl.h>
#include <spdlog/details/null_mutex.h>
#include <spdlog/details/periodic_worker-inl.h>
#include <spdlog/details/thread_pool-inl.h>
#include <spdlog/sinks/ansicolor_sink-inl.h>
#include <spdlog/sinks/base_sink-inl.h>
#include <spdlog/sinks/basic_file_sink-inl.h>
#include <spdlog/sinks/rotating_file_sink-inl.h>
#include <spdlog/sinks/stdout_color_sinks-inl.h>
#include <spdlog/sinks/stdout_sinks-inl.h>

namespace sinks = spdlog::sinks;
using spdlog::details::console_mutex;
using spdlog::details::console_nullmutex;

template class SPDLOG_API sinks::ansicolor_sink<console_mutex>;
template class SPDLOG_API sinks::ansicolor_sink<console_nullmutex>;
template class SPDLOG_API sinks::ansicolor_stdout_sink<console_mutex>;
template class SPDLOG_API sinks::ansicolor_stdout_sink<console_nullmutex>;
template class SPDLOG_API sinks::ansicolor_stderr_sink<console_mutex>;
template class SPDLOG_API sinks::ansicolor_stderr_sink<console_nullmutex>;

template class SPDLOG_API sinks::stdout_sink_base<console_mutex>;
template class SPDLOG_API sinks::stdout_sink_base<console_nullmutex>;
template class SPDLOG_API sinks::stdout_sink<console_mutex>;
template class SPDLOG_API sinks::stdout_sink<console_nullmutex>;
template class SPDLOG_API sinks::stderr_sink<console_mutex>;
template class SPDLOG_API sinks::stderr_sink<console_nullmutex>;

template class SPDLOG_API sinks::basic_file_sink<std::mutex>;
template class SPDLOG_API sinks::basic_file_sink<spdlog::details::null_mutex>;
template class SPDLOG_API sinks::rotating_file_sink<std::mutex>;
template class SPDLOG_API sinks::rotating_file_sink<spdlog::details::null_mutex>;

template class SPDLOG_API spdlog::details::mpmc_blocking_queue<spdlog::details::async_msg>;

// The factories of the console loggers, synchronous and asynchronous.
using Logger = std::shared_ptr<spdlog::logger>;
using spdlog::async_factory;
using spdlog::color_mode;
using spdlog::synchronous_factory;
template SPDLOG_API Logger spdlog::stdout_color_mt<synchronous_factory>(const std::string&, color_mode);
template SPDLOG_API Logger spdlog::stdout_color_st<synchronous_factory>(const std::string&, color_mode);
template SPDLOG_API Logger spdlog::stderr_color_mt<synchronous_factory>(const std::string&, color_mode);
template SPDLOG_API Logger spdlog::stderr_color_st<synchronous_factory>(const std::string&, color_mode);
template SPDLOG_API Logger spdlog::stdout_logger_mt<synchronous_factory>(const std::string&);
template SPDLOG_API Logger spdlog::stdout_logger_st<synchronous_factory>(const std::string&);
template SPDLOG_API Logger spdlog::stderr_logger_mt<synchronous_factory>(const std::string&);
template SPDLOG_API Logger spdlog::stderr_logger_st<synchronous_factory>(const std::string&);
template SPDLOG_API Logger spdlog::stdout_color_mt<async_factory>(const std::string&, color_mode);
template SPDLOG_API Logger spdlog::stdout_color_st<async_factory>(const std::string&, color_mode);
template SPDLOG_API Logger spdlog::stderr_color_mt<async_factory>(const std::string&, color_mode);
template SPDLOG_API Logger spdlog::stderr_color_st<async_factory>(const std::string&, color_mode);
template SPDLOG_API Logger spdlog::stdout_logger_mt<async_factory>(const std::string&);
template SPDLOG_API Logger spdlog::stdout_logger_st<async_factory>(const std::string&);
template SPDLOG_API Logger spdlog::stderr_logger_mt<async_factory>(const std::string&);
template SPDLOG_API Logger spdlog::stderr_logger_st<async_factory>(const std::string&);
