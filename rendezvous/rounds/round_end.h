// Why a rendezvous round ended: the value of the round's `end` key, which the first node
// to end the round writes (rendezvous/PROTOCOL.md, "End reasons"). On the wire it is text:
//   done | fail:<node> | final:<node> | abort:<node>:<signal> | join:<node> | evict:<node>
// where <node> is a node's name (host:pid; it may hold ':' but no '|'), <signal> a
// signal's name (SIGTERM). parse() and format() are the one place that text is read and
// written; everything else works on RoundEnd.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace ddprun::rendezvous {

struct RoundEnd {
  enum class Kind {
    kDone,   // every node's workers succeeded: the job ends with exit 0.
    kFail,   // a node's workers failed and restarts remain: the next round restarts them.
    kFinal,  // a node's workers failed with no restarts left: the job ends with exit 1.
    kAbort,  // an agent was stopped by a signal: the job ends with exit 1.
    kJoin,   // a node arrived while the job ran with room for it: re-form (scale up).
    kEvict,  // a node missed its keep-alives: re-form without it (scale down).
  };

  Kind kind = Kind::kDone;
  std::string node;    // who ended it (empty for kDone).
  std::string signal;  // kAbort: the signal that stopped the node (empty otherwise).

  static RoundEnd done() { return {Kind::kDone, {}, {}}; }
  static RoundEnd failure(std::string node) { return {Kind::kFail, std::move(node), {}}; }
  static RoundEnd finalFailure(std::string node) { return {Kind::kFinal, std::move(node), {}}; }
  static RoundEnd abort(std::string node, std::string signal) {
    return {Kind::kAbort, std::move(node), std::move(signal)};
  }
  static RoundEnd join(std::string node) { return {Kind::kJoin, std::move(node), {}}; }
  static RoundEnd evict(std::string node) { return {Kind::kEvict, std::move(node), {}}; }

  // The text form. parse(format()) gives back an equal RoundEnd when the node (and for
  // kAbort the signal) is not empty and the signal holds no ':', as ddprun's always are.
  std::string format() const;
  // Reads the text form; nothing for text that is not one (an unknown kind, a missing or
  // empty node or signal, "done" with anything after it). Text that is not one can only
  // come from something else than ddprun writing the key; callers take it as a
  // re-formation without a restart, so that it never ends a job.
  static std::optional<RoundEnd> parse(std::string_view text);

  // The next round's restart count is one higher (restarts(r) = restarts(r-1) + this).
  bool usesRestart() const { return kind == Kind::kFail; }
  // The job is over for every node: kDone, kFinal, kAbort.
  bool endsJob() const { return kind == Kind::kDone || failsJob(); }
  // The job is over and failed (exit 1): kFinal, kAbort.
  bool failsJob() const { return kind == Kind::kFinal || kind == Kind::kAbort; }

  bool operator==(const RoundEnd&) const = default;
};

}  // namespace ddprun::rendezvous
