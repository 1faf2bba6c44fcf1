// The owner's side of RRefs: the values this worker owns for RRefs, each with the count of
// user references to it that exist anywhere in the job. A value is kept while its count is
// above zero; the release that brings it to zero frees it. RRef ids are
// (creator rank, serial); this worker's own ids come from newId().
//
// Thread-safety: every method is thread-safe (one mutex). A value is freed outside that
// mutex, so RRefs inside a freed value may release themselves through the table.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "worker_runtime/rpc/rpc.h"

namespace ddprun::rpc::detail {

class RRefOwnerTable {
 public:
  explicit RRefOwnerTable(int rank) : rank_(rank) {}

  // A fresh id for an RRef this worker creates: (its rank, next serial).
  std::pair<int64_t, int64_t> newId() { return {rank_, next_serial_.fetch_add(1)}; }
  // Enters (or replaces) the value of an RRef with `refs` references (added to any counted
  // before the value arrived).
  void registerValue(int64_t creator, int64_t serial, Future value, int64_t refs);
  // Adds n references (n < 0 releases); the value is freed when the count reaches zero.
  // An id that is not here is logged (when adding) and ignored.
  void add(int64_t creator, int64_t serial, int64_t n);
  void release(int64_t creator, int64_t serial) { add(creator, serial, -1); }
  // The value's future. Throws DdprunError when it is not (or no longer) here.
  Future value(int64_t creator, int64_t serial);
  // How many values are kept.
  int64_t count();
  // Frees every value (at shutdown).
  void clear();

 private:
  struct Entry {
    Future value;
    int64_t refs = 0;
  };

  const int rank_;
  std::atomic<int64_t> next_serial_{0};
  std::mutex mutex_;
  std::map<std::pair<int64_t, int64_t>, Entry> owned_;
};

}  // namespace ddprun::rpc::detail
