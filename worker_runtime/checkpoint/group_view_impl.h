// Where this process stands in the group a collective checkpoint call is made over
// (checkpoint.h): the checkpoint library's insides, shared by its own files.
#pragma once

#include "worker_runtime/distributed.h"

namespace ddprun::checkpoint::detail {

struct GroupView {
  bool distributed = false;
  int rank = 0;
  int size = 1;
};

inline GroupView viewOf(const dist::Group& group) {
  if (!dist::is_initialized()) return {};
  return {true, dist::get_rank(group), dist::get_world_size(group)};
}

}  // namespace ddprun::checkpoint::detail
