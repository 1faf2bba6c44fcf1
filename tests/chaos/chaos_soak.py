#!/usr/bin/env python3
"""The chaos soak's driver (issue 36), run by chaos_soak_test.sh inside the namespaces it made.

1. A reference: the trainer uninterrupted on the 4 nodes (--nnodes=4), its checksum per step.
2. The soak: an agent on each node under --nnodes=2:4 and, one every few seconds, a fault
   drawn from a seeded schedule:
     kill_worker   kill -9 of a node's worker, once the job is warm: every node in the round
                   and every rank stepping (--warm-steps since it started; it waits up to
                   --warm-wait). A worker killed while its round starts, before every rank
                   joined its group, or while the job re-forms anyway, can only take the
                   whole-group restart; killed while every rank steps, it is what
                   --recovery=in-job replaces alone. After it, no fault until the job is past
                   the step the kill found (up to --hold-max): its way back is its own.
     stop_worker   SIGSTOP of a worker, SIGCONT 1-4 s later
     kill_agent    kill -9 of an agent (never a node the backend cannot lose: on c10d the
                   store host's, node 0, whose loss ends the job by design, as under torchrun)
     cut_link      the node's veth down for 2-6 s, then up (never a protected node's)
     rejoin        a node whose agent died (killed, or gave up on a cut link) starts a new
                   agent once its cooldown (3-8 s) is over
   Faults stop once the duration is over, the job is near its last step, or the rest of the
   run would no longer fit in --budget; then the job must finish.
3. The invariants:
     finished      every agent alive at the end of the faults exits 0; the last step is done
     sequence      each attempt resumes from the newest checkpoint saved before it, and its
                   steps run on from there without a gap; so no step is lost and none is
                   applied twice beyond the replay from the last checkpoint
     ranks agree   every rank of an attempt has the same parameters after each step
     bitwise       where the world size never changed (4 nodes from the start), each step's
                   parameters equal the reference's bit for bit; a replay at the same world
                   size equals the first run of that step
     leftovers     no process, /dev/shm segment of the job, agent cgroup, file in the agents'
                   TMPDIR (FIFOs, run directories) or listening socket left behind
     memory        each agent's RSS (from /proc, sampled through the run) grows by less than
                   --rss-growth-mb over its first sample
     etcd keys     (etcd) no key of the job left under its prefix
   Under --recovery=in-job a worker the agent replaced alone (issue 47) starts again inside
   its attempt: its start line must resume from the step it had reached (none replayed),
   and its steps must run on from there, equal to its ranks'.
     in job        (--recovery=in-job) not every worker kill whose way back was its own (no
                   other fault before the job's next new step) took the whole-group restart
4. The costs, per fault kind: how the job came back (in job: its next new step in the attempt
   it was in; restart: in a new attempt), the time lost (from the fault to the first new step,
   less one step) and the steps replayed (applied before the fault and again after it); the
   worker kills also split by the way back, and by whether the job was warm when they struck,
   with the agent's line for each warm one not recovered in job; under --recovery=in-job those
   recovered in job also by the struck node's warm spare at the kill (loaded and waiting on its
   pipe, still loading, or none): what a kill costs with the spare ready is the "loaded" row.
--recovery restart|in-job (default restart, as CI runs it) is the agents' --recovery; `both`
runs the soak once in each mode with the same seed (the same schedule of faults drawn, the
same reference) and prints the two modes' costs side by side at the end.
Backends: c10d (node 0, the store's host, is never killed or cut) and etcd (any node may be;
an etcd member killed and restarted, or cut off, is a fault of its own).
Python 3 of Debian, no packages beyond the standard library.
"""
import argparse
import collections
import glob
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time

FAST_CONF = "keep_alive_interval=0.5,keep_alive_max_attempt=3,last_call_timeout=1,read_timeout=3,join_timeout=30"
STORE_PORT = 29400


class C10dBackend:
    """The rendezvous store lives in node 0's agent: losing it ends the job (by design)."""
    name = "c10d"

    def __init__(self, args):
        self.args = args

    def flags(self, run_id):
        return ["--rdzv_backend=c10d", f"--rdzv_endpoint={self.args.subnet}.1:{STORE_PORT}", f"--rdzv_id={run_id}"]

    def protected_nodes(self):
        return {0}

    def extra_faults(self):
        return {}  # kind -> callable(driver); etcd: {"kill_etcd_member": ...}

    def start(self):
        pass

    def tick(self, force=False):
        pass

    def keys_left(self, run_ids):
        return []  # the store lives in node 0's agent and ends with it

    def stop(self):
        pass


class EtcdBackend:
    """The rendezvous on a 3-member etcd cluster, each member in a namespace of its own on the
    soak's bridge (at .101-.103, started by scripts/etcd-cluster): no node is protected, node 0
    included, and two faults of its own strike one member at a time, so the quorum holds: a
    member killed with SIGKILL and restarted on its data 2-6 s later, and a member's link cut
    for 2-6 s (a partition: it runs on, alone). At the end no key of the job may be left under
    its prefix."""
    name = "etcd"
    here = os.path.dirname(os.path.abspath(__file__))
    script = os.path.join(here, "..", "..", "scripts", "etcd-cluster")
    netns_sh = os.path.join(here, "..", "support", "netns.sh")

    def __init__(self, args):
        self.args = args
        self.dir = os.path.join(args.work, "etcd")
        self.tag = args.hub_netns[:-len("-hub")]
        self.hosts = [f"{args.subnet}.{101 + k}" for k in range(3)]
        self.netns = [f"{self.tag}-e{k + 1}" for k in range(3)]
        self.endpoints = ",".join(f"{h}:2379" for h in self.hosts)
        self.down = None  # (member 1-3, when it comes back, how it went: "kill" or "cut")

    def flags(self, run_id):
        return ["--rdzv_backend=etcd-v2", f"--rdzv_endpoint={self.endpoints}", f"--rdzv_id={run_id}"]

    def protected_nodes(self):
        return set()

    def extra_faults(self):
        return {} if self.down else {"kill_etcd_member": self.kill_member, "cut_etcd_link": self.cut_member}

    def cluster(self, *words, check=True):
        r = sh(self.script, words[0], self.dir, *words[1:])
        if check and r.returncode != 0:
            raise SystemExit(f"chaos: FAIL: scripts/etcd-cluster {' '.join(words)} exited {r.returncode}: "
                             f"{r.stdout.strip()[-600:]}")
        return r

    def veth(self, member):
        return f"e{member}b{self.args.veth_suffix}"

    def start(self):
        for k in range(3):
            r = sh("bash", "-c", 'source "$0"; netns_spoke "$@"', self.netns_sh, self.args.hub_netns, self.netns[k],
                   self.hosts[k], f"e{k + 1}", self.args.veth_suffix)
            if r.returncode != 0:
                raise SystemExit(f"chaos: FAIL: cannot wire etcd member {k + 1}'s namespace: {r.stdout.strip()}")
        r = self.cluster("start", "--hosts", ",".join(self.hosts), "--netns", ",".join(self.netns), check=False)
        if r.returncode == 77:  # etcd is not installed: ctest's skip
            print(f"SKIP: {r.stdout.strip()}", flush=True)
            raise SystemExit(77)
        if r.returncode != 0:
            raise SystemExit(f"chaos: FAIL: scripts/etcd-cluster start exited {r.returncode}: {r.stdout.strip()[-600:]}")
        log(f"etcd: 3 members at {self.endpoints}")

    def strike(self, soak, kind, what):
        member = soak.rng.randint(1, 3)
        leader = self.cluster("leader", check=False).stdout.strip()
        hold = soak.rng.uniform(2, 6)
        if kind == "kill_etcd_member":
            self.cluster("kill", str(member))
        else:
            sh("ip", "-n", self.args.hub_netns, "link", "set", self.veth(member), "down")
        self.down = (member, now() + hold, kind)
        soak.faults[kind] += 1
        soak.fault_log.append((time.time() * 1000, kind, -1))
        log(f"FAULT {sum(soak.faults.values()):3d} {kind} member {member}"
            f"{' (the leader)' if leader == str(member) else ''}: {what} for {hold:.1f} s")

    def kill_member(self, soak):
        self.strike(soak, "kill_etcd_member", "kill -9")

    def cut_member(self, soak):
        self.strike(soak, "cut_etcd_link", "link down")

    def tick(self, force=False):
        if self.down and (force or now() >= self.down[1]):
            member, _, kind = self.down
            if kind == "kill_etcd_member":
                self.cluster("restart", str(member))
                log(f"           etcd member {member}: restarted")
            else:
                sh("ip", "-n", self.args.hub_netns, "link", "set", self.veth(member), "up")
                log(f"           etcd member {member}: link up")
            self.down = None

    def keys_left(self, run_ids):
        """The job's keys still in etcd (its prefix is /ddprun/rdzv/<run id>/)."""
        left = []
        for run_id in run_ids:
            r = sh("ip", "netns", "exec", self.netns[0], "env", "ETCDCTL_API=3", "etcdctl",
                   f"--endpoints={self.endpoints}", "--dial-timeout=3s", "--command-timeout=5s", "get", "--prefix",
                   "--keys-only", f"/ddprun/rdzv/{run_id}/")
            if r.returncode != 0:
                left.append(f"etcdctl get failed: {r.stdout.strip()[:200]}")
            left += [k for k in r.stdout.split() if k.startswith("/ddprun/")]
        return left

    def stop(self):
        if os.path.isdir(self.dir):
            self.cluster("stop", check=False)


BACKENDS = {"c10d": C10dBackend, "etcd": EtcdBackend}


def now():
    return time.monotonic()


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Node:
    def __init__(self, index, args):
        self.index = index
        self.ns = f"{args.node_netns}{index}"
        self.addr = f"{args.subnet}.{index + 1}"
        self.veth = f"c{index}b{args.veth_suffix}"
        self.proc = None
        self.generation = 0
        self.pids = []          # every agent pid ever started here
        self.rejoin_at = None   # when a dead node may start a new agent
        self.cut_until = None
        self.stopped = None     # (pid, until) of a SIGSTOPped worker
        self.rss = {}           # agent pid -> [samples in kB]
        self.exit_codes = []    # (generation, code)
        self.log_path = None    # the current agent's log

    def alive(self):
        return self.proc is not None and self.proc.poll() is None


def proc_children(pid):
    kids = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                text = f.read()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2:].split()
        if fields and int(fields[1]) == pid:
            kids.append(int(stat.split("/")[2]))
    return kids


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def spare_state(pid):
    """What `pid` is as a warm spare of ddprun's runtime (docs/recovery.md, the warm spare):
    "loaded" once it is blocked reading its assignment pipe (its wait channel a pipe read, as
    bench/recovery_compare reads it), "loading" while it has not got there yet, None for any
    other process. A spare handed a rank is a worker: it closed that pipe (DDPRUN_SPARE_FD in
    the environment it started with, which /proc keeps showing)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        fd = env.get(b"DDPRUN_SPARE_FD", b"").decode()
        if env.get(b"DDPRUN_SPARE") != b"1" or not fd.isdigit() or not os.path.lexists(f"/proc/{pid}/fd/{fd}"):
            return None
        with open(f"/proc/{pid}/wchan") as f:
            return "loaded" if "pipe_read" in f.read() else "loading"
    except OSError:
        return None


def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def send(pid, sig):
    """Signals a pid this soak started; False when it is already gone (it died of an earlier fault)."""
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def sh(*cmd):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)


class Soak:
    def __init__(self, args, backend, recovery):
        self.args = args
        self.backend = backend
        self.recovery = recovery  # the agents' --recovery
        self.rng = random.Random(args.seed)
        self.nodes = [Node(k, args) for k in range(args.nodes)]
        self.faults = collections.Counter()
        self.fault_log = []  # (wall clock ms, kind, node)
        self.kills = {}      # index in fault_log -> what a kill_worker fault found (warm, the agent's log)
        self.failures = []
        self.pending_kill = None  # when a kill_worker was drawn that waits for the job to be warm
        self.hold = None          # (step, until): after a kill_worker, no fault until the job passes step
        self.next_warm_look = 0   # the step logs read at most twice a second while a kill waits
        self.steps_warm = False   # what the last look found
        self.next_hold_look = 0   # and while the job has not yet passed a kill's step

    # ---- agents ---------------------------------------------------------------------------
    def start_agent(self, node, run_id, nnodes, steps, step_ms, ckpt, logs):
        node.generation += 1
        tmp = os.path.join(self.args.work, "tmp", f"n{node.index}")
        os.makedirs(tmp, exist_ok=True)
        # DDPRUN_SHM=0: the ranks' collectives cross the veths (the nodes share a kernel, so the host
        # backend would take shared memory), and a cut link cuts them as between real hosts. File
        # timers on: each agent has its FIFO in TMPDIR, which must not outlive it.
        env = dict(os.environ, TMPDIR=tmp, DDPRUN_SHM="0", OMP_NUM_THREADS="1", TORCHELASTIC_ENABLE_FILE_TIMER="1")
        cmd = ["ip", "netns", "exec", node.ns, self.args.ddprun, f"--nnodes={nnodes}", "--nproc_per_node=1",
               *self.backend.flags(run_id), f"--local_addr={node.addr}", f"--rdzv_conf={FAST_CONF}",
               "--max_restarts=1000", f"--recovery={self.recovery}", "--no_python", self.args.trainer, f"--steps={steps}",
               f"--step-ms={step_ms}", "--checkpoint-every=5", f"--checkpoint-dir={ckpt}", f"--log-dir={logs}",
               "--timeout=60"]
        node.log_path = os.path.join(self.args.work, f"{run_id}.agent{node.index}.g{node.generation}.log")
        out = open(node.log_path, "w")
        node.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        out.close()
        node.pids.append(node.proc.pid)  # ip netns exec execs ddprun: the same pid
        node.rss[node.proc.pid] = []

    def worker_of(self, node):
        """The node's worker: its agent's chaos_trainer child that is not a waiting spare (pids
        wrap at 32768 here: the spare is not always the younger one)."""
        if not node.alive():
            return None
        for kid in proc_children(node.proc.pid):
            if comm(kid).startswith("chaos_trainer") and spare_state(kid) is None:
                return kid
        return None

    def spare_of(self, node):
        """The node's warm spare as it stands: "loaded", "loading" or "none"."""
        if node.alive():
            for kid in proc_children(node.proc.pid):
                if comm(kid).startswith("chaos_trainer") and (state := spare_state(kid)):
                    return state
        return "none"

    def reap(self, node):
        if node.proc is not None and node.proc.poll() is not None:
            node.exit_codes.append((node.generation, node.proc.returncode))
            log(f"node {node.index}: agent pid {node.proc.pid} exited {node.proc.returncode}")
            node.proc = None
            return True
        return False

    # ---- faults ---------------------------------------------------------------------------
    def fault(self, kind, node, what):
        self.faults[kind] += 1
        self.fault_log.append((time.time() * 1000, kind, node.index))
        log(f"FAULT {sum(self.faults.values()):3d} {kind:11s} node {node.index}: {what}")

    def inject(self):
        live = [n for n in self.nodes if n.alive() and n.cut_until is None and n.stopped is None]
        unprotected = [n for n in live if n.index not in self.backend.protected_nodes()]
        can_lose = sum(1 for n in self.nodes if n.alive() and n.cut_until is None) > 2  # --nnodes MIN stays
        choices = []
        with_worker = [(n, w) for n in live if (w := self.worker_of(n))]
        if with_worker:
            choices += ["kill_worker", "stop_worker"]
        if unprotected and can_lose:
            choices += ["kill_agent", "cut_link"]
        choices += list(self.backend.extra_faults())
        if not choices:
            return
        kind = self.rng.choice(choices)
        if kind == "kill_worker":
            self.pending_kill = now()
            self.kill_worker()
        elif kind == "stop_worker":
            node, pid = self.rng.choice(with_worker)
            hold = self.rng.uniform(1, 4)
            if send(pid, signal.SIGSTOP):
                node.stopped = (pid, now() + hold)
                self.fault(kind, node, f"SIGSTOP worker pid {pid} for {hold:.1f} s")
        elif kind == "kill_agent":
            node = self.rng.choice(unprotected)
            pid = node.proc.pid
            if send(pid, signal.SIGKILL):
                self.fault(kind, node, f"kill -9 agent pid {pid}")
        elif kind == "cut_link":
            node = self.rng.choice(unprotected)
            hold = self.rng.uniform(2, 6)
            sh("ip", "-n", self.args.hub_netns, "link", "set", node.veth, "down")
            node.cut_until = now() + hold
            self.fault(kind, node, f"link down for {hold:.1f} s")
        else:
            self.backend.extra_faults()[kind](self)

    def kill_worker(self):
        """The pending kill_worker, once the job is warm (or it waited --warm-wait): a worker killed
        while its round starts (before every rank joined its group) or while the job re-forms anyway
        can only take the whole-group restart, in either mode; killed while every rank steps, it
        is what --recovery=in-job replaces alone. Both modes wait alike, so their schedules stay
        comparable. Returns True once it struck (or found no worker to strike)."""
        waited = now() - self.pending_kill
        warm = self.warm()
        if warm:
            # The look that said so may be half a second old: a re-form that began meanwhile (a
            # node back after a cut link) put the kill inside another fault's restart, whose
            # replayed steps the summary then counted as the kill's (seed 32, c10d, in-job).
            self.next_warm_look = 0
            warm = self.warm()
        if not warm and waited < self.args.warm_wait:
            return False
        self.pending_kill = None
        live = [n for n in self.nodes if n.alive() and n.cut_until is None and n.stopped is None]
        with_worker = [(n, w) for n in live if (w := self.worker_of(n))]
        if not with_worker:
            return True
        node, pid = self.rng.choice(with_worker)
        offset = os.path.getsize(node.log_path) if os.path.exists(node.log_path) else 0
        step = self.newest_step(self.logs)
        # Under in-job recovery the node's spare takes the rank: loaded, it costs the job a re-form;
        # still loading, the rest of its start too.
        spare = self.spare_of(node) if self.recovery == "in-job" else None
        if send(pid, signal.SIGKILL):
            self.fault("kill_worker", node, f"kill -9 worker pid {pid}" +
                       (f" (the job warm after {waited:.1f} s" if warm else f" (not warm after {waited:.1f} s") +
                       (f", the node's spare {spare})" if spare else ")"))
            self.kills[len(self.fault_log) - 1] = {"warm": warm, "log": node.log_path, "offset": offset,
                                                   "spare": spare}
            # No other fault until the job is past where the kill found it: its recovery is the kill's.
            self.hold = (step, now() + self.args.hold_max)
        return True

    def warm(self):
        """Whether the job runs steadily: every node's agent alive and in the round (no link cut, no
        worker stopped, no node waiting to join), and every rank of the newest attempt has stepped
        --warm-steps times since it started and within the last five steps' time (0.6 s at least),
        none behind by more than a step. Looked at twice a second at most."""
        if any(not n.alive() or n.cut_until is not None or n.stopped is not None for n in self.nodes):
            return False
        if now() < self.next_warm_look:
            return self.steps_warm
        self.next_warm_look = now() + 0.5
        state = attempt_state(self.logs)
        self.steps_warm = False
        if state and set(state) == set(range(len(self.nodes))):
            wall_ms = time.time() * 1000
            recent_ms = max(600, 5 * self.args.step_ms)
            top = max(r["last"] for r in state.values())
            self.steps_warm = all(r["world"] == len(self.nodes) and r["since"] >= self.args.warm_steps and
                                  r["last"] >= top - 1 and wall_ms - r["t"] <= recent_ms for r in state.values())
        return self.steps_warm

    def finish_deadline(self, t):
        """How long the job may take to finish once the faults end at `t`."""
        if self.args.finish_timeout > 0:
            return min(t + self.args.finish_timeout, self.budget_end)
        return self.budget_end

    def release_hold(self):
        step, until = self.hold
        if now() < self.next_hold_look:
            return False
        self.next_hold_look = now() + 0.5
        if now() >= until or self.newest_step(self.logs) > step:
            self.hold = None
            return True
        return False

    def restore_due(self, force=False):
        for node in self.nodes:
            if node.stopped and (force or now() >= node.stopped[1]):
                if comm(node.stopped[0]).startswith("chaos_trainer"):  # not a pid reused since its agent killed it
                    send(node.stopped[0], signal.SIGCONT)
                log(f"           node {node.index}: SIGCONT worker pid {node.stopped[0]}")
                node.stopped = None
            if node.cut_until is not None and (force or now() >= node.cut_until):
                sh("ip", "-n", self.args.hub_netns, "link", "set", node.veth, "up")
                log(f"           node {node.index}: link up")
                node.cut_until = None

    # ---- progress from the step logs -------------------------------------------------------
    def newest_step(self, logs):
        """The highest step any rank has logged. (The newest file alone is no measure: a rank
        that has just started has only its start line there.)"""
        best = 0
        for path in glob.glob(os.path.join(logs, "steps.*")):
            try:
                size = os.stat(path).st_size
                with open(path, "rb") as f:
                    f.seek(max(0, size - 400))
                    tail = f.read().decode(errors="replace")
            except OSError:
                continue
            steps = re.findall(r" step=(\d+)", tail)
            if steps:
                best = max(best, int(steps[-1]))
        return best

    def sample_rss(self):
        for node in self.nodes:
            if node.alive():
                kb = rss_kb(node.proc.pid)
                if kb is not None:
                    node.rss[node.proc.pid].append(kb)

    # ---- runs -----------------------------------------------------------------------------
    def reference(self):
        run_id = f"ref{os.getpid()}"
        ckpt, logs = self.dirs(run_id)
        log(f"reference: {self.args.steps} steps uninterrupted on {len(self.nodes)} nodes (--nnodes={len(self.nodes)})")
        for node in self.nodes:
            self.start_agent(node, run_id, str(len(self.nodes)), self.args.steps, 0, ckpt, logs)
        deadline = now() + self.args.reference_timeout
        while any(n.alive() for n in self.nodes) and now() < deadline:
            time.sleep(0.2)
        codes = []
        for node in self.nodes:
            if node.alive():
                send(node.proc.pid, signal.SIGKILL)
                node.proc.wait()
            codes.append(node.proc.returncode)
            node.proc = None
        if codes != [0] * len(self.nodes):
            raise SystemExit(f"chaos: FAIL: the reference run did not finish: agents exited {codes}")
        ref = parse_logs(logs)
        sums = {}
        for (attempt, rank, step), rec in ref.steps.items():
            sums.setdefault(step, rec["sum"])
        if len(ref.attempts) != 1 or sorted(sums) != list(range(1, self.args.steps + 1)):
            raise SystemExit(f"chaos: FAIL: the reference run has {len(ref.attempts)} attempts and "
                             f"{len(sums)} of {self.args.steps} steps")
        step_times = sorted(r["t"] for r in ref.steps.values() if r["rank"] == 0)
        log(f"reference: done, final checksum {sums[self.args.steps]}, "
            f"{(step_times[-1] - step_times[0]) / 1000:.1f} s of steps")
        for node in self.nodes:
            node.pids.clear()
            node.rss.clear()
        return sums

    def dirs(self, run_id):
        ckpt = os.path.join(self.args.work, run_id, "ckpt")
        logs = os.path.join(self.args.work, run_id, "logs")
        os.makedirs(ckpt)
        os.makedirs(logs)
        return ckpt, logs

    def soak(self):
        run_id = f"chaos{os.getpid()}{self.recovery.replace('-', '')}"  # each mode of --recovery both its own
        self.run_id = run_id
        ckpt, logs = self.dirs(run_id)
        self.logs = logs
        steps = self.args.steps
        log(f"soak: {self.args.backend}, --recovery={self.recovery}, seed {self.args.seed}, {self.args.duration} s "
            f"of faults, {steps} steps "
            f"of {self.args.step_ms} ms, --nnodes=2:{len(self.nodes)}")
        start = now()
        for node in self.nodes:
            self.start_agent(node, run_id, f"2:{len(self.nodes)}", steps, self.args.step_ms, ckpt, logs)
        fault_end = start + self.args.duration
        next_fault = start + self.args.first_fault
        next_sample = start
        next_progress = start
        self.job_start = start
        self.fault_end_early = False
        while now() < fault_end and not self.fault_end_early:
            t = now()
            for node in self.nodes:
                if self.reap(node):
                    node.stopped = None
                    if node.index in self.backend.protected_nodes():
                        self.failures.append(f"finished: node {node.index}'s agent, which the {self.backend.name} "
                                             f"backend cannot lose, exited {node.exit_codes[-1][1]} during the faults")
                        self.fault_end_early = True
                    node.rejoin_at = t + self.rng.uniform(3, 8)
                    log(f"           node {node.index}: cooldown until +{node.rejoin_at - start:.1f} s")
            self.restore_due()
            self.backend.tick()
            for node in self.nodes:
                if node.proc is None and node.rejoin_at is not None and t >= node.rejoin_at and node.cut_until is None:
                    node.rejoin_at = None
                    self.start_agent(node, run_id, f"2:{len(self.nodes)}", steps, self.args.step_ms, ckpt, logs)
                    self.fault("rejoin", node, f"new agent pid {node.proc.pid} after its cooldown")
            if t >= next_sample:
                self.sample_rss()
                next_sample = t + 0.5
            if t >= next_progress:
                next_progress = t + 1
                done = self.newest_step(logs)
                if done >= steps * 0.9:
                    log("soak: the job is near its last step: no more faults")
                    break
                # The rest of the run, at 1.25 times its uninterrupted pace, must fit the wait for the job's
                # end: what is left of the budget, and at most --finish-timeout.
                if t + 1.25 * (steps - done) * (self.args.step_ms + 20) / 1000 + 30 > self.finish_deadline(t):
                    log(f"soak: step {done} of {steps}: what is left of the budget is the job's to finish: no more faults")
                    break
            if self.pending_kill is not None:
                if self.kill_worker():
                    next_fault = now() + self.rng.uniform(self.args.min_gap, self.args.max_gap)
            elif self.hold is not None:
                if self.release_hold():
                    next_fault = max(next_fault, now() + 1)
            elif t >= next_fault:
                self.inject()
                if self.pending_kill is None:
                    next_fault = t + self.rng.uniform(self.args.min_gap, self.args.max_gap)
            if not any(n.alive() for n in self.nodes):
                break
            time.sleep(0.1)
        self.restore_due(force=True)
        self.backend.tick(force=True)
        survivors = [n for n in self.nodes if n.alive()]
        fault_over = now()
        log(f"soak: faults over after {fault_over - start:.0f} s; waiting for nodes {[n.index for n in survivors]} to finish")
        deadline = self.finish_deadline(now())
        while any(n.alive() for n in survivors) and now() < deadline:
            self.sample_rss()
            time.sleep(0.5)
        self.job_end = now()
        for node in survivors:
            if node.alive():
                self.failures.append(f"finished: node {node.index}'s agent still runs {self.job_end - fault_over:.0f} s "
                                     "after the faults ended")
                send(node.proc.pid, signal.SIGKILL)
                node.proc.wait()
            self.reap(node)
            code = node.exit_codes[-1][1]
            if code != 0:
                self.failures.append(f"finished: node {node.index}'s surviving agent exited {code}")
        for node in self.nodes:  # agents that died after the last check
            if node.proc is not None:
                self.reap(node)
        if not survivors:
            self.failures.append("finished: no agent was left when the faults ended")


class Logs:
    def __init__(self):
        self.attempts = {}   # attempt -> {"world", "resumed", "t", "replaced"}
        self.steps = {}      # (attempt, rank, step) -> {"sum", "world", "t", "rank"}
        self.saved = []      # (t, attempt, step)
        self.done = []       # (attempt, rank, step, sum)
        self.twice = []      # (attempt, rank, step) logged more than once


STEP_FILE = re.compile(r"steps\.(\d+)\.(\d+)$")


def attempt_state(logs):
    """Where the ranks of the newest attempt in the step logs stand: {rank: {"world", "last" (its
    newest step), "t" (when), "since" (steps it logged since its newest start line: a replacement's
    start counts)}}; None before any attempt. Reads each file's first line and last few KB."""
    files = {}
    for path in glob.glob(os.path.join(logs, "steps.*")):
        m = STEP_FILE.search(path)
        if m:
            files.setdefault(int(m.group(1)), {})[int(m.group(2))] = path
    if not files:
        return None
    state = {}
    for rank, path in files[max(files)].items():
        try:
            size = os.stat(path).st_size
            with open(path, "rb") as f:
                head = f.read(300).decode(errors="replace").split("\n")[0]
                f.seek(max(0, size - 4096))
                tail = f.read().decode(errors="replace").split("\n")
        except OSError:
            continue
        if size > 4096:
            tail = tail[1:]  # the first line read may be cut
        m = LINE.match(head.strip())
        if not m or m.group(1) != "start":
            continue
        world = int(dict(kv.split("=", 1) for kv in m.group(4).split())["world"])
        # Steps since the newest start line; a start line older than the tail is long past.
        since, last, t = (0 if size <= 4096 else 10**6), 0, 0
        for line in tail:
            m = LINE.match(line.strip())
            if not m:
                continue
            if m.group(1) == "start":
                since = 0
            elif m.group(1) == "step":
                since += 1
                last = int(re.search(r" step=(\d+)", line).group(1))
                t = int(m.group(5))
        state[rank] = {"world": world, "last": last, "t": t, "since": since}
    return state


LINE = re.compile(r"^(start|step|saved|done) attempt=(\d+) rank=(\d+) (.*) t=(\d+)$")


def parse_logs(logs):
    out = Logs()
    for path in glob.glob(os.path.join(logs, "steps.*")):
        with open(path) as f:
            for line in f:
                m = LINE.match(line.strip())
                if not m:
                    continue  # a line cut short by kill -9
                kind, attempt, rank, rest, t = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4), int(m.group(5))
                kv = dict(item.split("=", 1) for item in rest.split())
                if kind == "start":
                    a = out.attempts.setdefault(attempt, {"world": int(kv["world"]), "resumed": {}, "t": t,
                                                          "replaced": []})
                    if rank in a["resumed"]:
                        # A second start of a rank in one attempt (its file is appended to, in order): a
                        # worker replaced alone (--recovery=in-job), the attempt number from a survivor.
                        a["replaced"].append((rank, int(kv["resumed"]), t))
                    else:
                        a["resumed"][rank] = int(kv["resumed"])
                    a["t"] = min(a["t"], t)
                elif kind == "step":
                    if (attempt, rank, int(kv["step"])) in out.steps:
                        out.twice.append((attempt, rank, int(kv["step"])))
                    out.steps[(attempt, rank, int(kv["step"]))] = {"sum": kv["sum"], "world": int(kv["world"]),
                                                                  "t": t, "rank": rank}
                elif kind == "saved":
                    out.saved.append((t, attempt, int(kv["step"])))
                else:
                    out.done.append((attempt, rank, int(kv["step"]), kv["sum"]))
    return out


def check_sequence(logs, total, reference, nodes, failures, every=5):
    """The sequence, ranks-agree and bitwise invariants. Returns per-attempt facts for the summary,
    the number of steps checked against the reference and of replays checked against a run of
    the same history.

    A step's history is the world size each earlier step ran at: segments (world, first step
    - 1), the attempt's own after those of the attempt whose checkpoint it loaded (the last one
    that logged saving that step, else the last one that applied it), cut at the step it resumed
    from. Applications of a step with equal histories must hold equal parameters; a history of
    full-size worlds only must hold the reference's."""
    by_attempt = collections.defaultdict(lambda: collections.defaultdict(dict))  # attempt -> rank -> step -> rec
    for (attempt, rank, step), rec in logs.steps.items():
        by_attempt[attempt][rank][step] = rec
    for attempt, rank, step in logs.twice:
        failures.append(f"sequence: attempt {attempt} rank {rank} applied step {step} twice")
    order = sorted(logs.attempts)
    applied_max = 0          # highest step applied by any earlier attempt
    saved_before = 0         # highest checkpoint logged complete by an earlier attempt
    history = {}             # attempt -> (key, pure)
    applied_by = {}          # step -> latest attempt that applied it
    saved_by = {}            # step -> latest attempt that logged its checkpoint
    seen = {}                # (step, history key) -> checksum
    pure_ok = replay_ok = 0
    facts = []
    for attempt in order:
        a = logs.attempts[attempt]
        world = a["world"]
        resumed = set(a["resumed"].values())
        if len(resumed) != 1:
            failures.append(f"sequence: attempt {attempt}'s ranks resumed from different steps {sorted(resumed)}")
            continue
        r = resumed.pop()
        if r < saved_before:
            failures.append(f"sequence: attempt {attempt} resumed from step {r}, but checkpoint {saved_before} "
                            "was complete before it started: steps lost")
        if r > applied_max or (r % every != 0 and r != total):
            failures.append(f"sequence: attempt {attempt} resumed from step {r}, which no earlier attempt "
                            f"checkpointed (highest applied step {applied_max})")
        origin = saved_by.get(r, applied_by.get(r))
        segments = [seg for seg in history.get(origin, ()) if seg[1] < r] if r > 0 else []
        if not segments or segments[-1][0] != world:
            segments.append((world, r))
        key = tuple(segments)
        pure = key == ((nodes, 0),)
        history[attempt] = key
        ranks = by_attempt.get(attempt, {})
        last = r
        for rank, steps in ranks.items():
            got = sorted(steps)
            # A replacement's start (--recovery=in-job) resumes from its ranks' step: nothing replayed
            # (a step logged by both processes is 'applied twice' above), nothing skipped. The process it
            # replaced may have died between applying a step and logging it: one step, as the next needs
            # the others' reduction; that step counts as applied.
            for rk, k, t in a["replaced"]:
                if rk != rank:
                    continue
                had = max([s for s, rec in steps.items() if rec["t"] <= t] or [r])
                if k < had:
                    failures.append(f"sequence: attempt {attempt} rank {rank}'s replacement resumed from step {k}, "
                                    f"behind step {had} it had applied: steps replayed in job")
                if k > had + 1:
                    failures.append(f"sequence: attempt {attempt} rank {rank}'s replacement resumed from step {k}, "
                                    f"past step {had + 1}: steps lost in job")
                got = sorted(set(got) | set(range(had + 1, k + 1)))
            expect = list(range(r + 1, r + 1 + len(got)))
            if got != expect:
                missing = sorted(set(expect) - set(got))[:5]
                failures.append(f"sequence: attempt {attempt} rank {rank} applied steps {got[:3]}..{got[-3:]} "
                                f"after resuming from {r}: not an unbroken run (missing {missing})")
            last = max(last, got[-1] if got else r)
        for s in sorted({s for steps in ranks.values() for s in steps}):
            sums = {steps[s]["sum"] for steps in ranks.values() if s in steps}
            if len(sums) != 1:
                failures.append(f"ranks agree: attempt {attempt} step {s}: ranks hold different parameters {sums}")
            the_sum = min(sums)
            if pure:
                if the_sum != reference[s]:
                    failures.append(f"bitwise: step {s} of attempt {attempt} ({nodes} nodes throughout) has "
                                    f"checksum {the_sum}, the uninterrupted run {reference[s]}")
                pure_ok += 1
            if (s, key) in seen:
                if seen[(s, key)] != the_sum:
                    failures.append(f"bitwise: step {s} replayed by attempt {attempt} differs from its earlier "
                                    "run with the same history")
                replay_ok += 1
            seen[(s, key)] = the_sum
            applied_by[s] = attempt
        for (t, at, s) in logs.saved:
            if at == attempt:
                saved_by[s] = attempt
                saved_before = max(saved_before, s)
        facts.append({"attempt": attempt, "world": world, "resumed": r, "last": last, "t": a["t"],
                      "replayed": max(0, min(applied_max, last) - r), "pure": pure, "replaced": len(a["replaced"])})
        applied_max = max(applied_max, last)
    if applied_max != total:
        failures.append(f"finished: the highest step applied is {applied_max}, not {total}")
    if order:
        final = order[-1]
        done = [d for d in logs.done if d[0] == final]
        if not done or any(d[2] != total for d in done):
            failures.append(f"finished: the last attempt's ranks did not all reach step {total}: {done}")
        elif history.get(final) == ((nodes, 0),) and {d[3] for d in done} != {reference[total]}:
            failures.append("bitwise: final parameters differ from the uninterrupted run's")
    return facts, pure_ok, replay_ok


def time_lost(logs, fault_log):
    """Per fault kind, the seconds from each fault until the job applied a step beyond the
    highest one applied before it, less one uninterrupted step (faults that overlap share the
    time). Also the median step interval within attempts: the uninterrupted pace, and each
    fault's time lost in fault_log's order (None: no new step after it)."""
    timeline = sorted((r["t"], s) for (a, rank, s), r in logs.steps.items() if rank == 0)
    by_attempt = collections.defaultdict(list)
    for (a, rank, s), r in logs.steps.items():
        if rank == 0:
            by_attempt[a].append((s, r["t"]))
    intervals = []
    for rows in by_attempt.values():
        rows.sort()
        intervals += [(t2 - t1) / 1000 for (s1, t1), (s2, t2) in zip(rows, rows[1:]) if s2 == s1 + 1]
    step = statistics.median(intervals) if intervals else 0.0
    lost = collections.defaultdict(list)
    each = []
    for t_fault, kind, node in fault_log:
        before = max([s for t, s in timeline if t <= t_fault] or [0])
        after = [t for t, s in timeline if t > t_fault and s > before]
        each.append(max(0.0, (after[0] - t_fault) / 1000 - step) if after else None)
        if after:
            lost[kind].append(each[-1])
    return lost, step, each


def steps_replayed(logs, fault_log):
    """Per fault kind, the steps each fault made the job apply again: the largest step rank 0
    went back by (to the checkpoint an attempt resumed from) between the fault and the next one;
    0 where the job went on from where it was (a worker replaced in job, a stopped worker).
    Rank 0 is there in every attempt; faults that overlap share the replay. Also each fault's
    replay in fault_log's order."""
    timeline = sorted((r["t"], s) for (a, rank, s), r in logs.steps.items() if rank == 0)
    ends = [t for t, _, _ in fault_log[1:]] + [float("inf")]
    replayed = collections.defaultdict(list)
    each = []
    for (t_fault, kind, node), t_end in zip(fault_log, ends):
        high = max([s for t, s in timeline if t <= t_fault] or [0])
        back = 0
        for t, s in timeline:
            if t_fault < t <= t_end:
                back = max(back, high - s + 1)
                high = max(high, s)
        replayed[kind].append(back)
        each.append(back)
    return replayed, each


def outcomes(logs, fault_log):
    """Per fault, how the job came back: "in job" where rank 0's first new step (beyond the highest
    it had logged before the fault and the one that may have been in flight: a step whose
    reduction completed before a kill is logged after it, in the old attempt, even when the job
    then restarts) belongs to the attempt it was in before the fault (a worker
    replaced alone, a stopped worker waited for; before the job's first step: the first attempt),
    "restart" where it belongs to a new attempt, None where no new step came. Also whether
    another fault came before that step (overtaken: the way back was not this fault's alone)."""
    timeline = sorted((r["t"], s, a) for (a, rank, s), r in logs.steps.items() if rank == 0)
    out = []
    for i, (t_fault, kind, node) in enumerate(fault_log):
        before = [(t, s, a) for t, s, a in timeline if t <= t_fault]
        high = max([s for t, s, a in before] or [0])
        after = [(t, s, a) for t, s, a in timeline if t > t_fault and s > high + 1]
        if not after:
            out.append((None, False))
            continue
        t_after, _, a_after = after[0]
        same = a_after == (before[-1][2] if before else timeline[0][2])
        overtaken = any(t_fault < t < t_after for t, _, _ in fault_log[i + 1:])
        out.append(("in job" if same else "restart", overtaken))
    return out


def agent_said(kill):
    """The killed worker's agent's first word on it: replaced alone, why not, or the round ending
    first (its log from where it stood at the kill)."""
    try:
        with open(kill["log"], errors="replace") as f:
            f.seek(kill["offset"])
            text = f.read(16384)
    except OSError:
        return "(no agent log)"
    for line in text.splitlines():
        if re.search(r"replaced alone|not in job: |re-forming the job|restarting the worker group", line):
            return line.strip()[:240]
    return "(nothing about it in the agent's log)"


def leftovers(soak, failures):
    args = soak.args
    deadline = now() + 15  # the guards of killed agents remove their cgroups within 5 s
    while True:
        procs = []
        for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
            try:
                with open(cmdline, "rb") as f:
                    text = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            pid = int(cmdline.split("/")[2])
            if args.work in text and pid != os.getpid():
                procs.append(f"{pid} ({text[:80]})")
        shm = [p for p in glob.glob("/dev/shm/ddprun*") if soak.run_id in p or f"ref{os.getpid()}" in p]
        pids = [pid for n in soak.nodes for pid in n.pids]
        cgroups = []
        for root in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
            for pid in pids:
                cgroups += glob.glob(f"{root}/ddprun-{pid}") + glob.glob(f"{root}/*/ddprun-{pid}") + \
                    glob.glob(f"{root}/*/*/ddprun-{pid}")
        tmp_left = []
        for dirpath, dirnames, filenames in os.walk(os.path.join(args.work, "tmp")):
            depth = dirpath[len(os.path.join(args.work, "tmp")):].count(os.sep)
            if depth >= 1:
                tmp_left += [os.path.join(dirpath, x) for x in dirnames + filenames]
        ports = []
        for n in soak.nodes:
            out = sh("ip", "netns", "exec", n.ns, "ss", "-Htlnu").stdout.strip()
            if out:
                ports.append(f"node {n.index}: {out}")
        keys = soak.keys_left
        found = {"process": procs, "shared-memory segment": shm, "cgroup": sorted(set(cgroups)),
                 "file in an agent's TMPDIR": tmp_left, "listening socket": ports, "etcd key": keys}
        if not any(found.values()) or now() >= deadline:
            break
        time.sleep(0.5)
    for what, items in found.items():
        if items:
            failures.append(f"leftovers: {len(items)} {what}(s) left: {items[:4]}")
    return found


def memory(soak, failures):
    rows = []
    for n in soak.nodes:
        for pid, samples in n.rss.items():
            if len(samples) < 4:
                continue
            # the baseline: about 5 s into the agent's life, once its threads and pools exist
            first, peak = samples[min(10, len(samples) // 2)], max(samples)
            growth = (peak - first) / 1024
            rows.append((n.index, pid, first / 1024, peak / 1024, growth, len(samples)))
            if growth > soak.args.rss_growth_mb:
                failures.append(f"memory: node {n.index}'s agent {pid} grew from {first / 1024:.1f} MB to "
                                f"{peak / 1024:.1f} MB (ceiling: +{soak.args.rss_growth_mb} MB)")
    return rows


def self_test():
    """The invariants' checker against step logs written here: a clean history passes, and each
    broken invariant (a lost step, a gap, a step applied twice, ranks apart, bits apart from
    the reference, a resume past any checkpoint) is named. Returns 0 when all hold."""
    import tempfile
    total, ref = 20, {s: f"r{s:02d}" for s in range(1, 21)}

    def write(dirname, attempts):
        # attempts: (id, world, resumed, steps applied, checkpoints saved, {step: checksum override})
        for attempt, world, resumed, applied, saved, sums in attempts:
            for rank in range(world):
                with open(os.path.join(dirname, f"steps.{attempt}.{rank}"), "w") as f:
                    f.write(f"start attempt={attempt} rank={rank} world={world} resumed={resumed} t={attempt}\n")
                    for s in applied:
                        the_sum = sums.get(s, ref[s] if world == 4 else f"w{world}-{s}")
                        if isinstance(the_sum, dict):
                            the_sum = the_sum.get(rank, the_sum["all"])
                        f.write(f"step attempt={attempt} rank={rank} world={world} step={s} sum={the_sum} t={attempt}\n")
                    for s in saved if rank == 0 else []:
                        f.write(f"saved attempt={attempt} rank=0 step={s} t={attempt}\n")
                    if applied and applied[-1] == total:
                        f.write(f"done attempt={attempt} rank={rank} step={total} sum={sums.get(total, ref[total] if world == 4 else f'w{world}-{total}')} t={attempt}\n")

    def replace(dirname, attempt, rank, world, logged, resumed):
        # Rank `rank` of a 4-node attempt from step 0 to the end, its first process having logged
        # steps 1..logged and its replacement (--recovery=in-job) starting at `resumed`.
        with open(os.path.join(dirname, f"steps.{attempt}.{rank}"), "w") as f:
            f.write(f"start attempt={attempt} rank={rank} world={world} resumed=0 t=1\n")
            for s in range(1, logged + 1):
                f.write(f"step attempt={attempt} rank={rank} world={world} step={s} sum={ref[s]} t=1\n")
            f.write(f"start attempt={attempt} rank={rank} world={world} resumed={resumed} t=2\n")
            for s in range(resumed + 1, total + 1):
                f.write(f"step attempt={attempt} rank={rank} world={world} step={s} sum={ref[s]} t=3\n")
            f.write(f"done attempt={attempt} rank={rank} step={total} sum={ref[total]} t=3\n")

    in_job = [(1, 4, 0, list(range(1, 21)), [5, 10, 15, 20], {})]
    clean = [(1, 4, 0, list(range(1, 13)), [5, 10], {}),   # killed after step 12
             (2, 4, 10, list(range(11, 18)), [15], {}),    # replays 11, 12; killed after 17
             (3, 3, 15, list(range(16, 21)), [20], {})]     # a node lost: 3 nodes to the end
    cases = {
        "clean": (clean, None),
        "lost": ([clean[0], (2, 4, 5, list(range(6, 21)), [10, 15, 20], {})], "steps lost"),
        "gap": ([clean[0], (2, 4, 10, [11, 12, 14] + list(range(15, 21)), [15, 20], {})], "not an unbroken run"),
        "twice": ([clean[0], (2, 4, 10, [11, 12, 12] + list(range(13, 21)), [15, 20], {})], "applied step 12 twice"),
        "apart": ([clean[0], (2, 4, 10, list(range(11, 21)), [15, 20], {13: {1: "x", "all": ref[13]}})],
                  "ranks hold different parameters"),
        "bits": ([clean[0], (2, 4, 10, list(range(11, 21)), [15, 20], {14: "x"})], "the uninterrupted run"),
        "replay": ([(1, 3, 0, list(range(1, 13)), [5, 10], {}),
                    (2, 3, 10, list(range(11, 21)), [15, 20], {12: "x"})], "differs from its earlier run"),
        "unsaved": ([clean[0], (2, 4, 13, list(range(14, 21)), [15, 20], {})], "no earlier attempt checkpointed"),
        "short": ([clean[0], clean[1]], "the highest step applied is 17"),
        # --recovery=in-job: rank 1 replaced alone in attempt 1 (logged, resumed)
        "in-job": (in_job, None, (8, 8)),
        "in-job unlogged": (in_job, None, (8, 9)),  # died after applying step 9, before logging it
        "in-job replay": (in_job, "applied step 7 twice", (8, 6)),
        "in-job ahead": (in_job, "steps lost in job", (8, 10)),  # steps 9 and 10 never applied by rank 1
    }
    bad = 0
    for name, (attempts, expect, *replaced) in cases.items():
        with tempfile.TemporaryDirectory() as d:
            write(d, attempts)
            for logged, resumed in replaced:
                replace(d, 1, 1, 4, logged, resumed)
            failures = []
            check_sequence(parse_logs(d), total, ref, 4, failures)
            ok = not failures if expect is None else any(expect in f for f in failures)
            print(f"self-test {name}: {'ok' if ok else 'WRONG'}" + ("" if ok else f" (failures: {failures})"))
            bad += not ok
    bad += self_test_outcomes()
    bad += self_test_worker_kills()
    bad += self_test_spares()
    bad += self_test_warm_look()
    return 1 if bad else 0


def self_test_warm_look():
    """A pending kill_worker looks afresh before it strikes: a look half a second old said warm,
    but a re-form started since (the newest attempt's ranks have started, none has stepped), so
    it waits; once every rank has stepped --warm-steps times just now, it strikes. Steps last
    logged a second ago are not warm either (a re-form under way before any new attempt)."""
    import tempfile
    import types
    bad = 0
    with tempfile.TemporaryDirectory() as d:
        def write(attempt, steps, ago_ms):
            t = int(time.time() * 1000) - ago_ms
            for rank in range(4):
                with open(os.path.join(d, f"steps.{attempt}.{rank}"), "w") as f:
                    f.write(f"start attempt={attempt} rank={rank} world=4 resumed=0 t={t}\n")
                    for s in range(1, steps + 1):
                        f.write(f"step attempt={attempt} rank={rank} world=4 step={s} sum=0 t={t}\n")

        node = types.SimpleNamespace(alive=lambda: True, cut_until=None, stopped=None)
        fake = types.SimpleNamespace(logs=d, nodes=[node] * 4, pending_kill=now(), steps_warm=True,
                                     next_warm_look=now() + 10, worker_of=lambda n: None,
                                     args=types.SimpleNamespace(warm_steps=3, step_ms=100, warm_wait=20))
        fake.warm = lambda: Soak.warm(fake)
        write(1, 5, 0)
        write(2, 0, 0)  # the re-form's attempt: started, no step yet
        cases = [("a stale look said warm, a re-form began since: waits", False)]
        got = [Soak.kill_worker(fake)]
        write(2, 3, 1000)
        fake.next_warm_look, fake.pending_kill = 0, now()
        cases.append(("steps a second old: waits", False))
        got.append(Soak.kill_worker(fake))
        write(2, 3, 0)
        fake.next_warm_look, fake.pending_kill = 0, now()
        cases.append(("every rank stepped 3 times just now: strikes", True))
        got.append(Soak.kill_worker(fake))
        for (name, want), g in zip(cases, got):
            ok = g == want
            print(f"self-test warm look, {name}: {'ok' if ok else 'WRONG'}")
            bad += not ok
    return bad


def self_test_spares():
    """A warm spare told apart from a worker, as /proc shows them: a process with the spare's
    environment blocked reading its pipe is a loaded spare, one not reading it yet a loading
    one, and one that no longer holds the pipe (a spare handed a rank) a worker, as is any
    other; and the in-job kills grouped by the spare they found. Each process is killed and
    reaped at the end; each wait is bounded."""
    bad = 0
    r, w = os.pipe()
    spare_env = dict(os.environ, DDPRUN_SPARE="1", DDPRUN_SPARE_FD=str(r))
    python = sys.executable
    procs = {}
    try:
        procs["loaded"] = subprocess.Popen([python, "-c", f"import os; os.read({r}, 1)"], env=spare_env, pass_fds=(r,))
        procs["loading"] = subprocess.Popen([python, "-c", "import time; time.sleep(60)"], env=spare_env,
                                            pass_fds=(r,))
        procs[None] = subprocess.Popen([python, "-c", "import time; time.sleep(60)"], env=spare_env)  # pipe closed
        procs["worker"] = subprocess.Popen([python, "-c", "import time; time.sleep(60)"])
        deadline = now() + 20
        want = {p.pid: ("loaded" if k == "loaded" else "loading" if k == "loading" else None) for k, p in procs.items()}
        got = {}
        while now() < deadline:
            got = {pid: spare_state(pid) for pid in want}
            if got == want:
                break
            time.sleep(0.1)
        ok = got == want
        print(f"self-test spares told from workers: {'ok' if ok else 'WRONG'}" +
              ("" if ok else f" (got {got}, want {want})"))
        bad += not ok
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
        os.close(r)
        os.close(w)
    kill = {"kind": "kill_worker", "way": "in job", "lost": 0.1, "replaced": 0}
    groups = by_kind([dict(kill, spare="loaded"), dict(kill, spare="loading", lost=3.0), dict(kill, way="restart",
                      spare="loaded"), dict(kill, spare=None)])
    ok = [len(groups.get(f"kill_worker, spare {s}", [])) for s in ("loaded", "loading", "none")] == [1, 1, 0] and \
        len(groups["kill_worker, in job"]) == 3
    print(f"self-test in-job kills grouped by their spare: {'ok' if ok else 'WRONG'}")
    return bad + (not ok)


def self_test_worker_kills():
    """Under --recovery=in-job, worker kills that all took the whole-group restart fail the soak
    with the agent's reason; one recovered in job passes it, as does a restart overtaken by the
    next fault, and --recovery=restart never fails on it."""
    import tempfile
    import types
    bad = 0
    with tempfile.TemporaryDirectory() as d:
        log_path = os.path.join(d, "agent.log")
        with open(log_path, "w") as f:
            f.write("[ddprun] info: starting 1 worker\n[ddprun] warning: rank 1 failed; restarting the whole "
                    "worker group, not in job: rank 0 never said it can re-form in process\n")
        kill = {"warm": True, "log": log_path, "offset": 0}
        restart = {"kind": "kill_worker", "way": "restart", "overtaken": False, "kill": kill, "warm": True}
        in_job = dict(restart, way="in job")
        overtaken = dict(restart, overtaken=True)
        cases = [("in-job", [restart, restart], "none of the 2 worker kill(s) was recovered in job; the first's "
                  "agent: [ddprun] warning: rank 1 failed; restarting the whole worker group, not in job: rank 0"),
                 ("in-job", [restart, in_job], None), ("in-job", [overtaken], None), ("restart", [restart], None)]
        for mode, each, expect in cases:
            soak = types.SimpleNamespace(recovery=mode, failures=[], args=types.SimpleNamespace(warm_wait=20))
            worker_kills(soak, each)
            ok = not soak.failures if expect is None else len(soak.failures) == 1 and expect in soak.failures[0]
            print(f"self-test worker kills, {mode}, {[f['way'] for f in each]}: {'ok' if ok else 'WRONG'}" +
                  ("" if ok else f" (failures: {soak.failures})"))
            bad += not ok
    return bad


def self_test_outcomes():
    """How the job came back from each fault, read off rank 0's steps: a kill the job rode out in
    its attempt (a worker replaced alone) is "in job", one followed by a new attempt that replays
    from a checkpoint "restart", a fault after which a second one came before any new step
    overtaken, and one with no new step after it None."""
    logs = Logs()
    # attempt 1: steps 1-12, one a second from t=1000; rank 1 killed at 4500, replaced alone
    # (its steps go on in attempt 1). Rank 0 killed at 12500; attempt 2 resumes from checkpoint
    # 10 at 15000 (steps 11-20: 11 and 12 replayed). A link cut at 20500 and an agent killed at
    # 21000 before attempt 3's first step at 23000 (steps 16-20 replayed, then 21-24). A stopped
    # worker at 40000, after the last step.
    for s in range(1, 13):
        logs.steps[(1, 0, s)] = {"t": 1000 * s, "sum": "x", "world": 4, "rank": 0}
    for s in range(11, 21):
        logs.steps[(2, 0, s)] = {"t": 15000 + 500 * (s - 11), "sum": "x", "world": 4, "rank": 0}
    for s in range(16, 23):
        logs.steps[(3, 0, s)] = {"t": 23000 + 500 * (s - 16), "sum": "x", "world": 4, "rank": 0}
    # Rank 0 logs step 24 after a kill at 27000 (its reduction was done), then attempt 4 resumes
    # from checkpoint 20 at 29000 (steps 21-25): a restart.
    logs.steps[(3, 0, 23)] = {"t": 26500, "sum": "x", "world": 4, "rank": 0}
    logs.steps[(3, 0, 24)] = {"t": 27100, "sum": "x", "world": 4, "rank": 0}
    for s in range(21, 26):
        logs.steps[(4, 0, s)] = {"t": 29000 + 500 * (s - 21), "sum": "x", "world": 4, "rank": 0}
    faults = [(4500, "kill_worker", 1), (12500, "kill_worker", 0), (20500, "cut_link", 2),
              (21000, "kill_agent", 3), (27000, "kill_worker", 2), (40000, "stop_worker", 1)]
    want = [("in job", False), ("restart", False), ("restart", True), ("restart", False), ("restart", False),
            (None, False)]
    got = outcomes(logs, faults)
    ok = got == want and steps_replayed(logs, faults)[1] == [0, 2, 0, 5, 4, 0]
    print(f"self-test outcomes: {'ok' if ok else 'WRONG'}" + ("" if ok else f" (got {got}, want {want})"))
    return 0 if ok else 1


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ddprun", required=True)
    p.add_argument("--trainer", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--node-netns", required=True, help="namespace prefix: PREFIX0 .. PREFIX<nodes-1>")
    p.add_argument("--hub-netns", required=True)
    p.add_argument("--veth-suffix", required=True)
    p.add_argument("--subnet", required=True, help="first three octets; node k is .k+1")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--backend", choices=sorted(BACKENDS), default="c10d")
    p.add_argument("--duration", type=float, default=120, help="seconds of faults")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--step-ms", type=int, default=100)
    p.add_argument("--steps", type=int, default=0, help="default: enough for the duration")
    p.add_argument("--first-fault", type=float, default=5)
    p.add_argument("--min-gap", type=float, default=3)
    p.add_argument("--max-gap", type=float, default=6)
    p.add_argument("--warm-steps", type=int, default=3,
                   help="a kill_worker waits until every rank stepped this often since it started")
    p.add_argument("--warm-wait", type=float, default=20,
                   help="longest wait of a kill_worker for the job to be warm (0: strike at once)")
    p.add_argument("--hold-max", type=float, default=30,
                   help="after a kill_worker, longest wait for the job to pass its step before the next fault")
    # The soak ends on its own inside --budget (ctest's TIMEOUT kills without a trap): the faults stop
    # early where the rest of the run would not fit, and the wait for the job's end stops at the budget
    # less 20 s for the leftovers' check.
    p.add_argument("--budget", type=float, default=0, help="seconds for everything (default: duration + 300)")
    # The faults stop early enough for the rest of the run to fit this wait. (A fixed 600 s that the
    # faults did not allow for failed a 30-minute soak at load 25: the budget stopped the faults with
    # 6,745 steps, about 730 s, left.)
    p.add_argument("--finish-timeout", type=float, default=0,
                   help="longest wait for the job after the faults (default 0: what is left of the budget)")
    p.add_argument("--reference-timeout", type=float, default=120)
    p.add_argument("--rss-growth-mb", type=float, default=32)
    p.add_argument("--keep", help="copy the logs here at the end")
    p.add_argument("--recovery", choices=["restart", "in-job", "both"], default="restart",
                   help="the agents' --recovery; both: one soak in each mode, the same seed, costs side by side")
    args = p.parse_args()
    if args.steps <= 0:
        # about half the duration's worth of uninterrupted steps: the faults cost the rest
        args.steps = max(50, int(args.duration * 1000 / (args.step_ms + 20) / 2) // 5 * 5)
    modes = ["restart", "in-job"] if args.recovery == "both" else [args.recovery]
    if args.budget <= 0:
        args.budget = len(modes) * args.duration + 300
    os.makedirs(os.path.join(args.work, "tmp"), exist_ok=True)
    backend = BACKENDS[args.backend](args)
    soaks = []
    t0 = now()
    end = t0 + args.budget - 20
    try:
        backend.start()
        reference = Soak(args, backend, modes[0]).reference()
        for i, mode in enumerate(modes):
            soak = Soak(args, backend, mode)
            soaks.append(soak)
            # Each mode its share of what is left of the budget.
            soak.budget_end = now() + (end - now()) / (len(modes) - i)
            soak.soak()
    finally:
        for soak in soaks:
            for n in soak.nodes:
                if n.alive():
                    send(n.proc.pid, signal.SIGKILL)
                    n.proc.wait()
            soak.restore_due(force=True)
        # (Read before the cluster stops: every agent has exited, so the last one out has removed them.)
        keys = backend.keys_left([s.run_id for s in soaks if hasattr(s, "run_id")] + [f"ref{os.getpid()}"])
        for soak in soaks:
            soak.keys_left = keys
        backend.stop()
        if args.keep:
            sh("cp", "-r", args.work, args.keep)
    costs = {soak.recovery: summary(soak, reference, t0) for soak in soaks}
    failed = [mode for mode, (ok, _) in costs.items() if not ok]
    if len(modes) > 1:
        compare(args, {mode: c for mode, (_, c) in costs.items()})
    if failed:
        print(f"\nchaos: FAIL with --recovery={','.join(failed)}")
        tail_agent_logs(args.work)
        return 1
    print("\nchaos: every invariant holds" + (" in both modes" if len(modes) > 1 else ""))
    return 0


def summary(soak, reference, t0):
    """Checks one soak's invariants and prints its summary. Returns (every invariant holds,
    {fault kind: (times lost, steps replayed)})."""
    args = soak.args
    failures = soak.failures
    logs = parse_logs(soak.logs)
    facts, pure_ok, replay_ok = check_sequence(logs, args.steps, reference, args.nodes, failures)
    left = leftovers(soak, failures)
    rss = memory(soak, failures)

    print(f"\n=== chaos soak summary (--recovery={soak.recovery}) ===")
    print(f"backend {args.backend}, seed {args.seed}, {args.nodes} nodes (--nnodes=2:{args.nodes}), "
          f"{args.steps} steps of {args.step_ms} ms, checkpoint every 5 steps")
    print(f"wall time: {now() - t0:.0f} s in all, the soaked job {soak.job_end - soak.job_start:.0f} s")
    print("faults injected: " + ", ".join(f"{k} {v}" for k, v in sorted(soak.faults.items())) +
          f" ({sum(soak.faults.values())} in all)")
    restarts = max(0, len(facts) - 1)
    worlds = collections.Counter(f["world"] for f in facts)
    replaced = sum(f["replaced"] for f in facts)
    print(f"attempts: {len(facts)} ({restarts} restarts); workers replaced in job: {replaced}; world sizes: " +
          ", ".join(f"{w} nodes x{c}" for w, c in sorted(worlds.items())))
    gaps = []
    for prev, cur in zip(facts, facts[1:]):
        prev_t = max([r["t"] for (a, rk, s), r in logs.steps.items() if a == prev["attempt"]] or [prev["t"]])
        first = min([r["t"] for (a, rk, s), r in logs.steps.items() if a == cur["attempt"]] or [cur["t"]])
        gaps.append((first - prev_t) / 1000)
    replayed = sum(f["replayed"] for f in facts)
    if gaps:
        print(f"time between attempts (last step to first step): median {statistics.median(gaps):.1f} s, "
              f"max {max(gaps):.1f} s, total {sum(gaps):.0f} s; steps replayed from checkpoints: {replayed}")
    _, clean_step, lost_each = time_lost(logs, soak.fault_log)
    _, replayed_each = steps_replayed(logs, soak.fault_log)
    ways = outcomes(logs, soak.fault_log)
    each = [{"kind": kind, "lost": lost, "replayed": back, "way": way, "overtaken": overtaken,
             "warm": soak.kills.get(i, {}).get("warm"), "spare": soak.kills.get(i, {}).get("spare"),
             "kill": soak.kills.get(i)}
            for i, ((_, kind, _), lost, back, (way, overtaken)) in enumerate(
                zip(soak.fault_log, lost_each, replayed_each, ways))]
    job = soak.job_end - soak.job_start
    clean = args.steps * clean_step
    n_faults = sum(soak.faults.values())
    if n_faults:
        print(f"job time {job:.0f} s against {clean:.0f} s uninterrupted ({clean_step * 1000:.0f} ms a step): "
              f"{(job - clean) / n_faults:.1f} s lost per fault on average")
    print("per fault kind: how the job came back (in job: its next step in the attempt it was in; restart: in "
          "a new one), the time lost (fault to the first new step, less one step) and the steps replayed")
    groups = by_kind(each)
    for kind in sorted(groups):
        print("  " + cost_row(kind, groups[kind]))
    print(worker_kills(soak, each))
    print(f"bitwise: {pure_ok} step(s) at 4 nodes throughout matched the uninterrupted run; "
          f"{replay_ok} replayed step(s) matched their first run")
    for node, pid, first, peak, growth, n in rss:
        print(f"agent RSS node {node} pid {pid}: {first:.1f} -> peak {peak:.1f} MB (+{growth:.1f}), {n} samples")
    exits = {n.index: [c for g, c in n.exit_codes] for n in soak.nodes}
    print(f"agent exit codes per node: {exits}")
    print("leftovers: " + ("none" if not any(left.values()) else str({k: len(v) for k, v in left.items()})))
    if failures:
        print(f"\nchaos: FAIL: {len(failures)} invariant(s) broken with --recovery={soak.recovery}:")
        for f in failures[:40]:
            print(f"  {f}")
    return not failures, groups


def by_kind(each):
    """The faults grouped by kind, the worker kills also by how the job came back, and (under
    --recovery=in-job) those it came back from in job also by the struck node's spare at the
    kill: loaded, still loading, or none."""
    groups = collections.defaultdict(list)
    for f in each:
        groups[f["kind"]].append(f)
        if f["kind"] == "kill_worker" and f["way"]:
            groups[f"kill_worker, {f['way']}"].append(f)
        if f["kind"] == "kill_worker" and f["way"] == "in job" and f.get("spare"):
            groups[f"kill_worker, spare {f['spare']}"].append(f)
    return groups


def cost_row(kind, faults):
    ways = collections.Counter(f["way"] for f in faults)
    lost = [f["lost"] for f in faults if f["lost"] is not None]
    back = [f["replayed"] for f in faults]
    text = f"{kind:20s} x{len(faults):3d}: in job {ways['in job']}, restart {ways['restart']}"
    if ways[None]:
        text += f", no step after {ways[None]}"
    if lost:
        text += f"; time lost median {statistics.median(lost):.2f} s, max {max(lost):.2f} s"
    return text + f"; steps replayed median {statistics.median(back):g}, max {max(back)}"


def worker_kills(soak, each):
    """The worker kills by when they struck: once the job was warm (every rank stepping, every node
    in the round) or not (--warm-wait ran out: a round starting, the job re-forming), and how the
    job came back from each. Under --recovery=in-job the warm ones the job did not come back from
    in job are listed with the agent's line, and a soak whose worker kills (each the only fault
    before the job's next new step) all took the whole-group restart fails."""
    kills = [f for f in each if f["kill"]]
    warm = [f for f in kills if f["warm"]]
    cold = [f for f in kills if not f["warm"]]
    count = lambda fs, way: sum(1 for f in fs if f["way"] == way)
    lines = [f"worker kills once the job was warm: {len(warm)} (in job {count(warm, 'in job')}, restart "
             f"{count(warm, 'restart')}, of which overtaken by the next fault "
             f"{sum(1 for f in warm if f['way'] == 'restart' and f['overtaken'])}); not warm within "
             f"{soak.args.warm_wait:g} s: {len(cold)} (in job {count(cold, 'in job')}, "
             f"restart {count(cold, 'restart')})"]
    if soak.recovery == "in-job":
        for f in warm:
            if f["way"] != "in job":
                lines.append(f"  warm kill, {f['way'] or 'no step after'}"
                             f"{' (overtaken)' if f['overtaken'] else ''}: {agent_said(f['kill'])}")
        clean = [f for f in kills if f["way"] and not f["overtaken"]]
        if clean and not any(f["way"] == "in job" for f in clean):
            soak.failures.append(f"in job: none of the {len(clean)} worker kill(s) was recovered in job; the "
                                 f"first's agent: {agent_said(clean[0]['kill'])}")
    return "\n".join(lines)


def compare(args, costs):
    """The two modes' costs per fault kind, side by side (--recovery both): how many faults the
    job came back from in job and by a restart, the time lost and the steps replayed."""
    print(f"\n=== --recovery=restart against --recovery=in-job: {args.backend}, seed {args.seed} ===")
    print(f"{'fault':20s} {'mode':8s} {'n':>3s} {'in_job':>6s} {'restart':>7s} {'lost_median_s':>13s} "
          f"{'lost_max_s':>10s} {'replayed_median':>15s} {'replayed_max':>12s}")
    for kind in sorted(set(costs["restart"]) | set(costs["in-job"])):
        for mode in ("restart", "in-job"):
            faults = costs[mode].get(kind, [])
            ways = collections.Counter(f["way"] for f in faults)
            lost = [f["lost"] for f in faults if f["lost"] is not None]
            back = [f["replayed"] for f in faults]
            row = f"{kind:20s} {mode:8s} {len(faults):3d} {ways['in job']:6d} {ways['restart']:7d}"
            if lost:
                row += (f" {statistics.median(lost):13.2f} {max(lost):10.2f} {statistics.median(back):15g} "
                        f"{max(back):12d}")
            print(row)


def tail_agent_logs(work):
    """The end of each node's newest agent log (the soak's, not the reference's)."""
    newest = {}
    for path in glob.glob(os.path.join(work, "chaos*.agent*.log")):
        m = re.search(r"\.agent(\d+)\.g(\d+)\.log$", path)
        if m and int(m.group(2)) >= newest.get(m.group(1), (0, ""))[0]:
            newest[m.group(1)] = (int(m.group(2)), path)
    for node in sorted(newest):
        path = newest[node][1]
        print(f"--- {os.path.basename(path)} (last lines)")
        with open(path, errors="replace") as f:
            for line in f.readlines()[-15:]:
                print("    " + line.rstrip())


if __name__ == "__main__":
    sys.exit(main())
