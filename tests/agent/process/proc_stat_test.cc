#include "agent/process/proc_stat.h"

#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>

#include <catch2/catch.hpp>

using ddprun::agent::readAllProcStats;
using ddprun::agent::readProcStat;

TEST_CASE("proc stat reads parent and group past a name with spaces and parentheses", "[proc_stat]") {
  char saved[17] = {};
  ::prctl(PR_GET_NAME, saved);
  ::prctl(PR_SET_NAME, "a) b (c) 1 2");
  const auto self = readProcStat(::getpid());
  ::prctl(PR_SET_NAME, saved);
  REQUIRE(self);
  CHECK(self->pid == ::getpid());
  CHECK(self->ppid == ::getppid());
  CHECK(self->pgid == ::getpgrp());
  CHECK(self->state == 'R');
  CHECK(self->start_time > 0);
  // The start time is fixed for the process's life: it tells it apart from a later one with its pid.
  CHECK(readProcStat(::getpid())->start_time == self->start_time);
}

TEST_CASE("proc stat has nothing for a pid that does not exist and lists this process", "[proc_stat]") {
  CHECK_FALSE(readProcStat(0));
  CHECK_FALSE(readProcStat(-1));
  const auto all = readAllProcStats();
  CHECK(std::any_of(all.begin(), all.end(), [](const auto& p) { return p.pid == ::getpid(); }));
}
