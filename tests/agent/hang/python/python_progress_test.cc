// The hook's recorder (agent/hang/python/_ddprun_progress.py) against the agent's reader
// (common/flight_ring.h): a Python process with a stand-in for torch.distributed_c10d (no torch
// needed) makes calls, and the rings it leaves are read back here, as the agent reads them.
#include <fstream>

#include <catch2/catch.hpp>

#include "agent/hang/python/python_hook.h"
#include "common/flight_ring.h"
#include "tests/support/test_process.h"

namespace ddprun::agent {
namespace {

using testing::run;
using testing::TempDir;
using namespace std::chrono_literals;

// A stand-in for torch.distributed.distributed_c10d: rank 2 of 4; a group made by new_group
// holds ranks 1 and 2 (this rank is its rank 1); a "second" group made later leaves rank 2
// out. Async calls return a Work that completes when the test says so.
const char* const kFakeC10d = R"PY(
import threading, types
class Group: pass
class Work:
    def __init__(self): self.done = threading.Event(); self.looks = 0
    def is_completed(self):
        look(self)
        return self.done.is_set()
    def get_future(self): raise RuntimeError("this Work has no future")  # as gloo's send and recv in torch 1.13
class GroupMember:
    WORLD = object()
    NON_GROUP_MEMBER = object()
members = {}
def is_initialized(): return True
def get_rank(group=None):
    if group is None: return 2
    return members.get(id(group), -1)
def get_world_size(group=None): return 4 if group is None else 2
def get_group_rank(group, rank): return {1: 0, 2: 1}[rank]
def new_group(ranks):
    if 2 not in ranks: return GroupMember.NON_GROUP_MEMBER
    g = Group(); members[id(g)] = ranks.index(2); return g
def all_reduce(tensor, op=None, group=None, async_op=False):
    if async_op: return Work()
def broadcast(tensor, src, group=None, async_op=False): pass
def barrier(group=None, async_op=False, device_ids=None): raise RuntimeError("peer gone")
def irecv(tensor, src=None, group=None, tag=0): return Work()
def all_gather_object(object_list, obj, group=None):
    all_reduce(None)  # an inner call: it belongs to this one
)PY";

// For a script body: waits on the hook's own events, not on time. endsAfter(n) returns once
// the hook has ended n records in all (each _Call's first finish counts), lookedAt(things, n)
// once each of `things` (a Work or an Event of the stand-ins, whose looks the poller counts
// up) has been looked at n times. 10 s at most each: a guard, never reached when the poller works.
const char* const kWaits = R"PY(
import threading
looked = threading.Condition()
ends = [0]
_finish = p._Call.finish
def _counted(self, ok):
    mine = self.rec is not None
    _finish(self, ok)
    with looked:
        ends[0] += mine
        looked.notify_all()
p._Call.finish = _counted
def _until(what, holds):
    with looked:
        if not looked.wait_for(holds, 10):
            sys.exit('the poller never ' + what)
def endsAfter(n):
    _until('ended the record', lambda: ends[0] >= n)
def lookedAt(things, n):
    _until('looked', lambda: all(t.looks >= n for t in things))
def look(thing):
    with looked:
        thing.looks += 1
        looked.notify_all()
)PY";

std::string script(const std::string& hook_dir, const std::string& body) {
  return "import sys, types\n"
         "sys.path.insert(0, '" +
         hook_dir +
         "')\n"
         "import _ddprun_progress as p\n" +
         kWaits +
         "dc = types.ModuleType('fake_c10d')\n"
         "dc.look = look\n"
         "exec(" +
         "'''" + kFakeC10d + "''', dc.__dict__)\n" + "p._patch(dc)\n" + body;
}

FlightRingSnapshot ringAt(const std::string& path) {
  std::string error;
  auto ring = readFlightRingFile(path, &error);
  INFO(error);
  REQUIRE(ring);
  return *ring;
}

TEST_CASE("the Python hook's rings read back as the agent reads them: ops, groups, roots, states", "[unit]") {
  TempDir dir;
  writePythonHook(dir.file("hook"));
  const std::string body =
      "dc.all_reduce(None)\n"
      "g = dc.new_group([1, 2])\n"
      "dc.new_group([0, 3])\n"
      "dc.broadcast(None, 1, group=g)\n"
      "dc.all_gather_object([], 'x')\n"
      "try:\n"
      "    dc.barrier()\n"
      "except RuntimeError:\n"
      "    pass\n"
      "w = dc.all_reduce(None, async_op=True)\n"
      "r = dc.irecv(None, src=1)\n"
      "before = ends[0]\n"
      "w.done.set()\n"
      "endsAfter(before + 1)\n"  // the poller's next look (every 50 ms) ends w's record
      "print('recorded', flush=True)\n";
  std::ofstream(dir.file("job.py")) << script(dir.file("hook"), body);
  auto r = run({"/usr/bin/python3", dir.file("job.py")}, {{"DDPRUN_FLIGHT_DIR", dir.path()}}, 30s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.err.empty());  // nothing said: recording never broke

  const FlightRingSnapshot world = ringAt(dir.file(flightRingFileName(2, 0)));
  CHECK(world.rank == 2);
  CHECK(world.group_rank == 2);
  CHECK(world.group_size == 4);
  REQUIRE(world.records.size() == 4);
  CHECK(world.records[0].info.op == FlightOp::kAllReduce);
  CHECK(world.records[0].state == FlightState::kCompleted);
  CHECK(world.records[0].ended_ns >= world.records[0].started_ns);
  // all_gather_object's inner all_reduce is its own, not a record.
  CHECK(world.records[1].info.op == FlightOp::kAllGather);
  CHECK(world.records[2].info.op == FlightOp::kBarrier);
  CHECK(world.records[2].state == FlightState::kFailed);
  // The async all_reduce completed when its Work did.
  CHECK(world.records[3].state == FlightState::kCompleted);

  // new_group's first group is group 1 on every rank; this rank is its rank 1 of 2, and the
  // broadcast's root (global rank 1) is its rank 0.
  const FlightRingSnapshot group = ringAt(dir.file(flightRingFileName(2, 1)));
  CHECK(group.group == 1);
  CHECK(group.group_rank == 1);
  CHECK(group.group_size == 2);
  REQUIRE(group.records.size() == 1);
  CHECK(group.records[0].info.op == FlightOp::kBroadcast);
  CHECK(group.records[0].info.root == 0);

  // The irecv whose wait never came stays pending in the message ring, from rank 1.
  const FlightRingSnapshot messages = ringAt(dir.file(flightRingFileName(2, 0, FlightRingKind::kPointToPoint)));
  CHECK(messages.kind == FlightRingKind::kPointToPoint);
  REQUIRE(messages.records.size() == 1);
  CHECK(messages.records[0].info.op == FlightOp::kRecv);
  CHECK(messages.records[0].info.root == 1);
  CHECK(messages.records[0].state == FlightState::kStarted);
}

TEST_CASE("the Python hook keeps a GPU collective pending until the GPU has done it, not until the call returns",
          "[unit]") {
  TempDir dir;
  writePythonHook(dir.file("hook"));
  // A stand-in for torch with CUDA events the test completes, and a tensor on the GPU. As with
  // NCCL, a synchronous call returns once its work is queued and an async call's future is
  // complete at once: neither says the GPU has done the collective.
  const std::string body =
      "import shutil\n"
      "torch = types.ModuleType('torch')\n"
      "for n in ('float32', 'float64', 'float16', 'bfloat16', 'int32', 'int64', 'uint8'):\n"
      "    setattr(torch, n, n)\n"
      "events = []\n"
      "class Event:\n"
      "    def __init__(self): self.done = False; self.looks = 0; events.append(self)\n"
      "    def record(self): pass\n"
      "    def query(self):\n"
      "        look(self)\n"
      "        return self.done\n"
      "torch.cuda = types.SimpleNamespace(Event=Event)\n"
      "sys.modules['torch'] = torch\n"
      "class Queued:\n"
      "    def add_done_callback(self, fn): fn(self)\n"
      "    def value(self): return []\n"
      "dc.Work.get_future = lambda self: Queued()\n"
      "class Tensor:\n"
      "    is_cuda = True\n"
      "    dtype = 'float32'\n"
      "    def numel(self): return 8\n"
      "t = Tensor()\n"
      "dc.all_reduce(t)\n"
      "w = dc.all_reduce(t, async_op=True)\n"
      "lookedAt([events[0], w], 2)\n"  // the poller looked at both twice and ended neither
      "ring = '" +
      dir.file(flightRingFileName(2, 0)) +
      "'\n"
      "shutil.copy(ring, ring + '.queued')\n"
      "before = ends[0]\n"
      "events[0].done = True\n"
      "w.done.set()\n"
      "endsAfter(before + 2)\n"
      "print(len(events), 'event(s)', flush=True)\n";
  std::ofstream(dir.file("job.py")) << script(dir.file("hook"), body);
  auto r = run({"/usr/bin/python3", dir.file("job.py")}, {{"DDPRUN_FLIGHT_DIR", dir.path()}}, 30s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.err.empty());
  CHECK(r.out == "1 event(s)\n");  // the sync call's; the async one's own Work is asked

  const FlightRingSnapshot queued = ringAt(dir.file(flightRingFileName(2, 0)) + ".queued");
  REQUIRE(queued.records.size() == 2);
  CHECK(queued.records[0].info.count == 8);
  CHECK(queued.records[0].state == FlightState::kStarted);
  CHECK(queued.records[1].state == FlightState::kStarted);
  const FlightRingSnapshot done = ringAt(dir.file(flightRingFileName(2, 0)));
  REQUIRE(done.records.size() == 2);
  CHECK(done.records[0].state == FlightState::kCompleted);
  CHECK(done.records[1].state == FlightState::kCompleted);
}

TEST_CASE("the Python hook records nothing without the agent's directory, and the calls still run", "[unit]") {
  TempDir dir;
  writePythonHook(dir.file("hook"));
  // sitecustomize.py itself, as a worker's interpreter runs it, with no DDPRUN_FLIGHT_DIR.
  // Loaded from its file: Debian's own sitecustomize was imported at startup under that name.
  std::ofstream(dir.file("job.py")) << "import sys, importlib.util\nsys.path.insert(0, '" << dir.file("hook")
                                    << "')\nspec = importlib.util.spec_from_file_location('hook', '"
                                    << dir.file("hook/sitecustomize.py")
                                    << "')\nspec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
                                       "print('patched' if any(type(f).__name__ == '_Finder' for f in sys.meta_path) "
                                       "else 'untouched', flush=True)\n";
  auto r = run({"/usr/bin/python3", dir.file("job.py")}, {}, 30s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.out == "untouched\n");
  auto on = run({"/usr/bin/python3", dir.file("job.py")}, {{"DDPRUN_FLIGHT_DIR", dir.path()}}, 30s);
  REQUIRE(on.finished);
  CHECK(on.out == "patched\n");
  auto off = run({"/usr/bin/python3", dir.file("job.py")},
                 {{"DDPRUN_FLIGHT_DIR", dir.path()}, {"DDPRUN_FLIGHT_RECORDER", "0"}}, 30s);
  REQUIRE(off.finished);
  CHECK(off.out == "untouched\n");
}

}  // namespace
}  // namespace ddprun::agent
