// Each rank contributes rank+1; all_reduce(SUM) must give 1+2+...+N on every rank, and
// all_gather must return every rank's value in rank order.
#include <cstdio>

#include "worker_runtime/distributed.h"
#include "worker_runtime/error_record.h"

int main() {
  return ddprun::runtime::recordErrors([] {
    namespace dist = ddprun::dist;
    dist::init_process_group();
    const int rank = dist::get_rank();
    const int world = dist::get_world_size();
    auto sum = at::full({4}, static_cast<double>(rank + 1), at::kDouble);
    dist::all_reduce(sum);
    std::vector<at::Tensor> gathered;
    for (int r = 0; r < world; ++r) gathered.push_back(at::full({1}, -1, at::kLong));
    dist::all_gather(gathered, at::full({1}, rank, at::kLong));
    std::string order;
    for (const auto& t : gathered) order += std::to_string(t.item<int64_t>());
    std::printf("example rank=%d world=%d sum=%.0f gathered=%s\n", rank, world, sum[3].item<double>(), order.c_str());
    dist::destroy_process_group();
    return 0;
  });
}
