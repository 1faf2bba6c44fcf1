// In-job recovery's start-up record (worker_runtime/recovery/startup_record.h) on a fake
// backend: what a survivor's start-up collectives returned reaches a replacement as the same
// values without a peer, and a replacement whose start-up differs fails with a line saying
// how, instead of waiting for peers that will never answer.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "common/error.h"
#include "worker_runtime/recovery/startup_record.h"

namespace {

using ddprun::DdprunError;
using ddprun::dist::Backend;
using ddprun::dist::ReduceOp;
using ddprun::recovery::StartupRecord;
using ddprun::runtime::Work;
using ddprun::runtime::WorkPtr;

// Stands for the peers: a broadcast yields 7s, an all_reduce doubles, an all_gather fills
// output i with i; every op is counted.
class FakePeers final : public Backend {
 public:
  int calls = 0;
  std::string_view name() const override { return "fake"; }
  WorkPtr broadcast(at::Tensor& t, int, bool) override {
    return done([&] { t.fill_(7); });
  }
  WorkPtr allReduce(at::Tensor& t, ReduceOp, bool) override {
    return done([&] { t.mul_(2); });
  }
  WorkPtr reduce(at::Tensor&, int, ReduceOp, bool) override {
    return done([] {});
  }
  WorkPtr allGather(std::vector<at::Tensor>& out, const at::Tensor&, bool) override {
    return done([&] {
      for (size_t i = 0; i < out.size(); ++i) out[i].fill_(static_cast<int64_t>(i));
    });
  }
  WorkPtr gather(const at::Tensor&, std::vector<at::Tensor>*, int, bool) override {
    return done([] {});
  }
  WorkPtr scatter(at::Tensor&, const std::vector<at::Tensor>*, int, bool) override {
    return done([] {});
  }
  WorkPtr reduceScatter(at::Tensor&, const std::vector<at::Tensor>&, ReduceOp, bool) override {
    return done([] {});
  }
  WorkPtr allToAll(std::vector<at::Tensor>&, const std::vector<at::Tensor>&, bool) override {
    return done([] {});
  }
  WorkPtr barrier(bool) override {
    return done([] {});
  }
  WorkPtr send(const at::Tensor&, int, int) override {
    return done([] {});
  }
  WorkPtr recv(at::Tensor&, int, int) override {
    return done([] {});
  }

 private:
  template <typename F>
  WorkPtr done(F f) {
    ++calls;
    f();
    return Work::completed(nullptr);
  }
};

// A survivor's start-up as the chaos trainer makes it: a broadcast, an all_gather, an
// all_reduce and a barrier; the record as a replacement receives it.
std::shared_ptr<StartupRecord> survivorsRecord() {
  FakePeers peers;
  auto record = std::make_shared<StartupRecord>(StartupRecord::Mode::kRecording);
  auto wrapped = record->wrap(peers);
  at::Tensor attempt = at::zeros({1}, at::kLong);
  wrapped->broadcast(attempt, 0, false);
  std::vector<at::Tensor> shapes{at::zeros({3}), at::zeros({3})};
  wrapped->allGather(shapes, at::zeros({3}), /*async_op=*/true);
  at::Tensor sum = at::full({2, 2}, 1.5);
  wrapped->allReduce(sum, ReduceOp::SUM, false);
  wrapped->barrier(false);
  record->endRecording();
  REQUIRE(peers.calls == 4);
  return StartupRecord::deserialize(record->serialize());
}

}  // namespace

TEST_CASE("startup record: a replacement's start-up collectives return what the survivor's did without asking a peer",
          "[unit]") {
  auto record = survivorsRecord();
  FakePeers nobody;
  auto wrapped = record->wrap(nobody);
  at::Tensor attempt = at::zeros({1}, at::kLong);
  wrapped->broadcast(attempt, 0, false);
  CHECK(attempt.item<int64_t>() == 7);
  std::vector<at::Tensor> shapes{at::full({3}, -1.0), at::full({3}, -1.0)};
  wrapped->allGather(shapes, at::zeros({3}), false);
  CHECK(shapes[1].equal(at::ones({3})));
  at::Tensor sum = at::zeros({2, 2});
  wrapped->allReduce(sum, ReduceOp::SUM, /*async_op=*/true)->wait();
  CHECK(sum.equal(at::full({2, 2}, 3.0)));
  wrapped->barrier(false);
  record->finishReplay();
  CHECK(nobody.calls == 0);
  // Done: every later op goes to the peers again.
  wrapped->barrier(false);
  CHECK(nobody.calls == 1);
}

TEST_CASE("startup record: a replacement whose start-up differs fails naming the collective", "[unit]") {
  auto record = survivorsRecord();
  FakePeers nobody;
  auto wrapped = record->wrap(nobody);
  at::Tensor t = at::zeros({1}, at::kLong);
  CHECK_THROWS_WITH(wrapped->allReduce(t, ReduceOp::SUM, false),
                    Catch::Contains("start-up collective #1 is a all_reduce where the survivors' was a broadcast"));
  CHECK(nobody.calls == 0);
}

TEST_CASE("startup record: a replacement that takes its state early or late fails saying where", "[unit]") {
  auto record = survivorsRecord();
  FakePeers nobody;
  auto wrapped = record->wrap(nobody);
  at::Tensor attempt = at::zeros({1}, at::kLong);
  wrapped->broadcast(attempt, 0, false);
  CHECK_THROWS_WITH(record->finishReplay(), Catch::Contains("after 1 start-up collectives, the survivors after 4"));
}

TEST_CASE("startup record: a point-to-point op in start-up makes the record unusable, and a replacement refuses it",
          "[unit]") {
  FakePeers peers;
  auto record = std::make_shared<StartupRecord>(StartupRecord::Mode::kRecording);
  auto wrapped = record->wrap(peers);
  at::Tensor t = at::zeros({1});
  wrapped->send(t, 1, 0);
  std::string why;
  CHECK_FALSE(record->usable(&why));
  CHECK(why == "its start-up made a send, which a record cannot answer");

  auto replaying = StartupRecord::deserialize(StartupRecord(StartupRecord::Mode::kDone).serialize());
  auto replay = replaying->wrap(peers);
  CHECK_THROWS_WITH(replay->recv(t, 0, 0), Catch::Contains("start-up made a recv before it took its state"));
}
