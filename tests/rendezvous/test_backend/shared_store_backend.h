// A third rendezvous backend, the tests' own, plugged in from this folder alone: it
// registers itself with rendezvous/backends.h as "test-shared" (shared_store_backend.cc)
// and nothing outside this folder names it. Its store stands for one on a shared
// filesystem: a store in this process named by --rdzv_endpoint, that no node hosts and
// that outlives the job (the last node out removes the job's keys), with the rounds' own
// keep-alive counters. The nodes of a job are threads of the test.
#pragma once

#include <string>

#include "tests/support/in_memory_store.h"

namespace ddprun::rendezvous::testing {

inline constexpr const char* kSharedBackend = "test-shared";

// The store named `name` (the job's --rdzv_endpoint), as the nodes of the job see it; made
// at first use by a node of the job. Throws StoreError when no node opened it yet.
InMemoryStore& sharedStore(const std::string& name);

}  // namespace ddprun::rendezvous::testing
