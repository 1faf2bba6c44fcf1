#include "worker_runtime/recovery/startup_record.h"

#include <cstring>

#include <fmt/format.h>

#include "common/error.h"

namespace ddprun::recovery {
namespace {

using dist::Backend;
using dist::P2PItem;
using dist::ReduceOp;
using runtime::Work;
using runtime::WorkPtr;

// Wraps one backend of the default group while its record is kept or replayed; once the
// record is done, every op goes straight through.
class StartupBackend final : public Backend {
 public:
  StartupBackend(std::shared_ptr<StartupRecord> record, Backend& inner) : record_(std::move(record)), inner_(inner) {}

  std::string_view name() const override { return inner_.name(); }

  WorkPtr broadcast(at::Tensor& tensor, int root, bool async_op) override {
    return symmetric("broadcast", {tensor}, async_op, [&](bool a) { return inner_.broadcast(tensor, root, a); });
  }
  WorkPtr allReduce(at::Tensor& tensor, ReduceOp op, bool async_op) override {
    return symmetric("all_reduce", {tensor}, async_op, [&](bool a) { return inner_.allReduce(tensor, op, a); });
  }
  WorkPtr allGather(std::vector<at::Tensor>& outputs, const at::Tensor& input, bool async_op) override {
    return symmetric("all_gather", outputs, async_op, [&](bool a) { return inner_.allGather(outputs, input, a); });
  }
  WorkPtr barrier(bool async_op) override {
    return symmetric("barrier", {}, async_op, [&](bool a) { return inner_.barrier(a); });
  }
  WorkPtr reduce(at::Tensor& tensor, int root, ReduceOp op, bool async_op) override {
    other("reduce");
    return inner_.reduce(tensor, root, op, async_op);
  }
  WorkPtr gather(const at::Tensor& input, std::vector<at::Tensor>* outputs, int root, bool async_op) override {
    other("gather");
    return inner_.gather(input, outputs, root, async_op);
  }
  WorkPtr scatter(at::Tensor& output, const std::vector<at::Tensor>* inputs, int root, bool async_op) override {
    other("scatter");
    return inner_.scatter(output, inputs, root, async_op);
  }
  WorkPtr reduceScatter(at::Tensor& output, const std::vector<at::Tensor>& inputs, ReduceOp op,
                        bool async_op) override {
    other("reduce_scatter");
    return inner_.reduceScatter(output, inputs, op, async_op);
  }
  WorkPtr allToAll(std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs, bool async_op) override {
    other("all_to_all");
    return inner_.allToAll(outputs, inputs, async_op);
  }
  WorkPtr send(const at::Tensor& tensor, int peer, int tag) override {
    other("send");
    return inner_.send(tensor, peer, tag);
  }
  WorkPtr recv(at::Tensor& tensor, int peer, int tag) override {
    other("recv");
    return inner_.recv(tensor, peer, tag);
  }
  std::vector<WorkPtr> batchP2P(std::vector<P2PItem>& items) override {
    other("batch_isend_irecv");
    return inner_.batchP2P(items);
  }

 private:
  // A collective whose result is the same on every rank: recorded after it completes (the
  // op runs synchronously meanwhile, which start-up code hardly notices), or answered from
  // the record.
  template <typename Run>
  WorkPtr symmetric(const char* op, std::vector<at::Tensor> outputs, bool async_op, Run run) {
    switch (record_->mode()) {
      case StartupRecord::Mode::kReplaying: record_->replay(op, outputs); return Work::completed(nullptr);
      case StartupRecord::Mode::kRecording: {
        WorkPtr work = run(false);
        work->wait();
        record_->record(op, outputs);
        return work;
      }
      case StartupRecord::Mode::kDone: break;
    }
    return run(async_op);
  }
  void other(const char* op) {
    switch (record_->mode()) {
      case StartupRecord::Mode::kReplaying:
        throw DdprunError(fmt::format(
            "in-job recovery: this replacement's start-up made a {} before it took its state; only broadcast, "
            "all_reduce, all_gather and barrier can be answered from the survivors' record (docs/recovery.md)",
            op));
      case StartupRecord::Mode::kRecording: record_->markUnusable(op); break;
      case StartupRecord::Mode::kDone: break;
    }
  }

  std::shared_ptr<StartupRecord> record_;
  Backend& inner_;
};

void putU64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); }
void putString(std::string& out, const std::string& s) {
  putU64(out, s.size());
  out += s;
}

class Reader {
 public:
  explicit Reader(const std::string& bytes) : bytes_(bytes) {}
  uint64_t u64() {
    uint64_t v = 0;
    std::memcpy(&v, take(sizeof v), sizeof v);
    return v;
  }
  std::string string() {
    const uint64_t n = u64();
    return std::string(take(n), n);
  }
  const char* take(uint64_t n) {
    if (n > bytes_.size() - pos_) throw DdprunError("in-job recovery: the survivors' start-up record is truncated");
    const char* p = bytes_.data() + pos_;
    pos_ += n;
    return p;
  }

 private:
  const std::string& bytes_;
  size_t pos_ = 0;
};

}  // namespace

void StartupRecord::endRecording() {
  Mode recording = Mode::kRecording;
  mode_.compare_exchange_strong(recording, Mode::kDone, std::memory_order_acq_rel);
}

bool StartupRecord::usable(std::string* why) const {
  std::lock_guard lock(mutex_);
  if (why) *why = unusable_;
  return unusable_.empty();
}

void StartupRecord::record(const char* op, const std::vector<at::Tensor>& outputs) {
  Entry entry{op, {}};
  size_t bytes = 0;
  for (const auto& t : outputs) {
    entry.outputs.push_back(t.detach().cpu().clone(at::MemoryFormat::Contiguous));
    bytes += t.numel() * t.element_size();
  }
  std::lock_guard lock(mutex_);
  if (!unusable_.empty()) return;
  bytes_ += bytes;
  if (bytes_ > kMaxBytes) {
    unusable_ = fmt::format("its start-up collectives returned more than {} bytes", kMaxBytes);
    entries_.clear();
    return;
  }
  entries_.push_back(std::move(entry));
}

void StartupRecord::markUnusable(const char* op) {
  std::lock_guard lock(mutex_);
  if (unusable_.empty()) unusable_ = fmt::format("its start-up made a {}, which a record cannot answer", op);
  entries_.clear();
}

std::string StartupRecord::serialize() const {
  std::lock_guard lock(mutex_);
  std::string out;
  putU64(out, entries_.size());
  for (const auto& e : entries_) {
    putString(out, e.op);
    putU64(out, e.outputs.size());
    for (const auto& t : e.outputs) {
      putU64(out, static_cast<uint64_t>(t.scalar_type()));
      putU64(out, static_cast<uint64_t>(t.dim()));
      for (int64_t d : t.sizes()) putU64(out, static_cast<uint64_t>(d));
      const size_t n = t.numel() * t.element_size();
      putU64(out, n);
      out.append(static_cast<const char*>(t.data_ptr()), n);
    }
  }
  return out;
}

std::shared_ptr<StartupRecord> StartupRecord::deserialize(const std::string& bytes) {
  auto record = std::make_shared<StartupRecord>(Mode::kReplaying);
  Reader in(bytes);
  const uint64_t count = in.u64();
  for (uint64_t i = 0; i < count; ++i) {
    Entry e{in.string(), {}};
    const uint64_t tensors = in.u64();
    for (uint64_t k = 0; k < tensors; ++k) {
      const auto dtype = static_cast<at::ScalarType>(in.u64());
      std::vector<int64_t> sizes(in.u64());
      for (auto& d : sizes) d = static_cast<int64_t>(in.u64());
      at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(dtype));
      const uint64_t n = in.u64();
      if (n != static_cast<uint64_t>(t.numel() * t.element_size())) {
        throw DdprunError("in-job recovery: the survivors' start-up record is damaged");
      }
      std::memcpy(t.data_ptr(), in.take(n), n);
      e.outputs.push_back(std::move(t));
    }
    record->entries_.push_back(std::move(e));
  }
  return record;
}

void StartupRecord::replay(const char* op, std::vector<at::Tensor>& outputs) {
  std::lock_guard lock(mutex_);
  const size_t index = next_;
  if (index >= entries_.size()) {
    throw DdprunError(
        fmt::format("in-job recovery: this replacement's start-up made a {} (collective #{}) that the survivors' did "
                    "not make before they took their state; its start-up must make the same collectives (docs/"
                    "recovery.md)",
                    op, index + 1));
  }
  const Entry& e = entries_[index];
  bool same = e.op == op && e.outputs.size() == outputs.size();
  for (size_t i = 0; same && i < outputs.size(); ++i) {
    same = e.outputs[i].numel() == outputs[i].numel() && e.outputs[i].scalar_type() == outputs[i].scalar_type();
  }
  if (!same) {
    throw DdprunError(
        fmt::format("in-job recovery: this replacement's start-up collective #{} is a {} where the survivors' was a "
                    "{} of other tensors; its start-up must make the same collectives (docs/recovery.md)",
                    index + 1, op, e.op));
  }
  for (size_t i = 0; i < outputs.size(); ++i) outputs[i].detach().copy_(e.outputs[i].view(outputs[i].sizes()));
  ++next_;
}

void StartupRecord::finishReplay() {
  std::lock_guard lock(mutex_);
  if (next_ != entries_.size()) {
    throw DdprunError(fmt::format(
        "in-job recovery: this replacement took its state after {} start-up collectives, the survivors after {}; its "
        "start-up must make the same collectives (docs/recovery.md)",
        next_, entries_.size()));
  }
  mode_.store(Mode::kDone, std::memory_order_release);
}

std::unique_ptr<dist::Backend> StartupRecord::wrap(dist::Backend& inner) {
  return std::make_unique<StartupBackend>(shared_from_this(), inner);
}

}  // namespace ddprun::recovery
