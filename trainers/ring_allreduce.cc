// The hand-written ring allreduce of PyTorch's tutorial "Writing Distributed Applications
// with PyTorch" (section "Our Own Ring-Allreduce"), in C++ on ddprun::dist. Each of the
// size - 1 steps sends a buffer to the right neighbour with isend, receives the left
// neighbour's into the other buffer with recv, and accumulates it; the two buffers swap
// roles every step. The result is checked against dist::all_reduce on the same input.
//
//   ddprun --standalone --nproc_per_node=3 --no_python build/bin/ring_allreduce [--numel N]
//
// Prints one line per rank with the result; exits 0 only when both sums agree.
#include <cstdio>
#include <cstdlib>
#include <string>

#include <ATen/ATen.h>

#include "common/env_reader.h"
#include "worker_runtime/distributed.h"
#include "worker_runtime/error_record.h"

namespace dist = ddprun::dist;

namespace {

// recv = the sum of every rank's `send`, as the tutorial's allreduce(send, recv).
void ringAllReduce(const at::Tensor& send, at::Tensor& recv) {
  const int rank = dist::get_rank();
  const int size = dist::get_world_size();
  at::Tensor send_buff = send.clone();
  at::Tensor recv_buff = send.clone();
  at::Tensor accum = send.clone();

  const int left = (rank - 1 + size) % size;
  const int right = (rank + 1) % size;

  for (int i = 0; i < size - 1; ++i) {
    dist::WorkPtr send_req;
    if (i % 2 == 0) {
      // Send send_buff, receive into recv_buff.
      send_req = dist::isend(send_buff, right);
      dist::recv(recv_buff, left);
      accum += recv_buff;
    } else {
      // Send recv_buff (what arrived last step), receive into send_buff.
      send_req = dist::isend(recv_buff, right);
      dist::recv(send_buff, left);
      accum += send_buff;
    }
    send_req->wait();
  }
  recv.copy_(accum);
}

std::string preview(const at::Tensor& t) {
  std::string text = "[";
  const int64_t shown = std::min<int64_t>(t.numel(), 6);
  for (int64_t i = 0; i < shown; ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(t[i].item<int64_t>());
  }
  if (t.numel() > shown) text += ", ...";
  return text + "]";
}

}  // namespace

int main(int argc, char** argv) {
  return ddprun::runtime::recordErrors([&] {
    int64_t numel = 8;
    if (argc == 3 && std::string(argv[1]) == "--numel") {
      numel = ddprun::env::parseInteger("--numel", argv[2], 1, INT64_MAX);
    } else if (argc != 1) {
      std::fprintf(stderr, "usage: ring_allreduce [--numel N]\n");
      return 2;
    }
    dist::init_process_group();
    const int rank = dist::get_rank();
    const int size = dist::get_world_size();

    // Small integers: every summation order gives the same float result.
    at::Tensor input = (at::arange(numel, at::kFloat).remainder(100) + 1) * (rank + 1);
    at::Tensor ring = at::empty_like(input);
    ringAllReduce(input, ring);

    at::Tensor reference = input.clone();
    dist::all_reduce(reference);
    const bool same = at::equal(ring, reference);

    std::printf("rank %d of %d: ring allreduce %s %s dist::all_reduce %s\n", rank, size, preview(ring).c_str(),
                same ? "==" : "!=", preview(reference).c_str());
    dist::destroy_process_group();
    return same ? 0 : 1;
  });
}
