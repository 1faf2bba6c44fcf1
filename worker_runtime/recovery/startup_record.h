// In-job recovery's record of a worker's start-up collectives (docs/recovery.md). A
// replacement runs the trainer's code from the top: init_process_group, DDP's construction
// (its shape check and parameter broadcast), whatever the trainer broadcasts before it
// resumes. The survivors made those collectives long ago and will not make them again, so
// each rank records what its start-up collectives on the default group returned, and a
// replacement is answered from a survivor's record instead of by its peers, until it reaches
// the point where it takes its state (CheckpointManager::resumeLatest).
//
// Only collectives whose result is the same on every rank can be answered so: broadcast,
// all_reduce, all_gather and barrier. Any other op during start-up (gather, scatter, point
// to point...) marks the record unusable, and a recovery that would need it falls back to
// the whole-group restart. Recording ends at the first gradient reduction or at the seam,
// whichever comes first, and the record is bounded (kMaxBytes), so it costs nothing later.
//
// Thread-safety: a record is driven by the thread that drives the default group; its mode
// may be read from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "worker_runtime/backend/backend.h"

namespace ddprun::recovery {

class StartupRecord : public std::enable_shared_from_this<StartupRecord> {
 public:
  enum class Mode { kRecording, kReplaying, kDone };
  // A record holds up to this many bytes of results; beyond it, it is unusable.
  static constexpr size_t kMaxBytes = size_t{1} << 30;

  explicit StartupRecord(Mode mode) : mode_(mode) {}

  Mode mode() const { return mode_.load(std::memory_order_acquire); }
  // Ends recording (kDone); a record being replayed stays so until finishReplay().
  void endRecording();
  // Whether a replacement could be answered from it; else why not.
  bool usable(std::string* why) const;

  // The record as bytes (for a replacement), and a record made from them (kReplaying).
  std::string serialize() const;
  static std::shared_ptr<StartupRecord> deserialize(const std::string& bytes);
  // The replay's end: every entry must have been used. Throws DdprunError otherwise.
  void finishReplay();

  // A backend that records (or replays) every op through `inner`. The record must be owned
  // by a shared_ptr.
  std::unique_ptr<dist::Backend> wrap(dist::Backend& inner);

  // For the wrappers.
  void record(const char* op, const std::vector<at::Tensor>& outputs);
  void markUnusable(const char* op);
  // Copies the next entry into `outputs`; throws DdprunError when it is not `op` with
  // tensors like these.
  void replay(const char* op, std::vector<at::Tensor>& outputs);

 private:
  struct Entry {
    std::string op;
    std::vector<at::Tensor> outputs;  // CPU copies
  };
  std::atomic<Mode> mode_;
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
  size_t bytes_ = 0;
  size_t next_ = 0;  // replay position
  std::string unusable_;
};

}  // namespace ddprun::recovery
