// The names of every environment variable the agent sets for its workers and the ones
// it reads itself. The agent and its workers talk only through these and the store, so
// both sides spell them from this one header.
#pragma once

namespace ddprun::env {

inline constexpr const char* kRank = "RANK";
inline constexpr const char* kLocalRank = "LOCAL_RANK";
inline constexpr const char* kWorldSize = "WORLD_SIZE";
inline constexpr const char* kLocalWorldSize = "LOCAL_WORLD_SIZE";
inline constexpr const char* kGroupRank = "GROUP_RANK";
inline constexpr const char* kGroupWorldSize = "GROUP_WORLD_SIZE";
inline constexpr const char* kRoleRank = "ROLE_RANK";
inline constexpr const char* kRoleWorldSize = "ROLE_WORLD_SIZE";
inline constexpr const char* kRoleName = "ROLE_NAME";
inline constexpr const char* kMasterAddr = "MASTER_ADDR";
inline constexpr const char* kMasterPort = "MASTER_PORT";
inline constexpr const char* kRestartCount = "TORCHELASTIC_RESTART_COUNT";
inline constexpr const char* kMaxRestarts = "TORCHELASTIC_MAX_RESTARTS";
inline constexpr const char* kRunId = "TORCHELASTIC_RUN_ID";
inline constexpr const char* kUseAgentStore = "TORCHELASTIC_USE_AGENT_STORE";
inline constexpr const char* kErrorFile = "TORCHELASTIC_ERROR_FILE";
inline constexpr const char* kTorchNcclAsyncErrorHandling = "TORCH_NCCL_ASYNC_ERROR_HANDLING";
// torch 1.13 reads the older spelling; setting both keeps either generation safe.
inline constexpr const char* kNcclAsyncErrorHandling = "NCCL_ASYNC_ERROR_HANDLING";
inline constexpr const char* kOmpNumThreads = "OMP_NUM_THREADS";
// --virtual_local_rank: the one device a worker sees (its LOCAL_RANK is then 0).
inline constexpr const char* kCudaVisibleDevices = "CUDA_VISIBLE_DEVICES";
// The signals that stop the job, as torchrun exports them to its workers.
inline constexpr const char* kSignalsToHandle = "TORCHELASTIC_SIGNALS_TO_HANDLE";
// The RPC peers' shared secret: a file of mode 0600 written by the agent each round.
inline constexpr const char* kRpcSecretFile = "DDPRUN_RPC_SECRET_FILE";
// The secret itself, for workers started by another launcher.
inline constexpr const char* kRpcSecret = "DDPRUN_RPC_SECRET";
// The named pipe of torch's file timers (TORCHELASTIC_ENABLE_FILE_TIMER=1): the agent
// creates it (or takes this name from its own environment), workers write requests into it.
inline constexpr const char* kTimerFile = "TORCHELASTIC_TIMER_FILE";
// Set to 1 for Python workers unless --no_python_faulthandler or already set: SIGABRT
// then prints every thread's Python traceback before the worker dies.
inline constexpr const char* kPythonFaultHandler = "PYTHONFAULTHANDLER";
// The directory (on /dev/shm) where each worker keeps its process groups' flight recorder
// rings (common/flight_ring.h), for the agent to read; the agent makes and removes it.
inline constexpr const char* kFlightDir = "DDPRUN_FLIGHT_DIR";
// Python workers' startup hook (agent/hang/python/python_hook.h): ddprun's sitecustomize.py goes first
// on PYTHONPATH (and chains to the next one); it registers faulthandler for the signal
// DDPRUN_PYTHON_STACKS_SIGNAL names, writing into DDPRUN_PYTHON_STACKS_DIR (the worker's
// directory of the attempt), and saves an uncaught exception's traceback there.
inline constexpr const char* kPythonPath = "PYTHONPATH";
inline constexpr const char* kPythonStacksDir = "DDPRUN_PYTHON_STACKS_DIR";
inline constexpr const char* kPythonStacksSignal = "DDPRUN_PYTHON_STACKS_SIGNAL";
// torch's flight recorder (ProcessGroupNCCL, torch 2.2 through 2.11), on by default for
// Python workers unless --no_torch_flight_recorder or the user set them. Where torch renamed
// one, both names are set (the older first).
inline constexpr const char* kTorchNcclTraceBufferSize = "TORCH_NCCL_TRACE_BUFFER_SIZE";
inline constexpr const char* kTorchFrBufferSize = "TORCH_FR_BUFFER_SIZE";
inline constexpr const char* kTorchNcclDumpOnTimeout = "TORCH_NCCL_DUMP_ON_TIMEOUT";
inline constexpr const char* kTorchNcclDebugInfoTempFile = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE";
inline constexpr const char* kTorchFrDumpTempFile = "TORCH_FR_DUMP_TEMP_FILE";

// Read by the workers (set by the user, not the agent).
// 0: collectives of a group on one host go over TCP instead of shared memory.
inline constexpr const char* kShm = "DDPRUN_SHM";
// 0: process groups record nothing in their flight recorder (it is on by default).
inline constexpr const char* kFlightRecorder = "DDPRUN_FLIGHT_RECORDER";
// fashion_mnist's fault injection for the restart demo: crash at this step, on this rank.
inline constexpr const char* kCrashAtStep = "DDPRUN_CRASH_AT_STEP";
inline constexpr const char* kCrashRank = "DDPRUN_CRASH_RANK";
// The terminal's type; "dumb" (Emacs shells, some CI logs) takes no cursor movement, so the
// trainers' progress bar prints plain lines there.
inline constexpr const char* kTerm = "TERM";
// Where programs are looked up (the launcher's program resolver, the agent's stack tools).
inline constexpr const char* kPath = "PATH";
// Where temporary run directories and the file timer's pipe go when no path is given.
inline constexpr const char* kTmpDir = "TMPDIR";
// SLURM's node list of the job (`ddprun-slurm hostnames` expands it).
inline constexpr const char* kSlurmJobNodelist = "SLURM_JOB_NODELIST";

// Read by the agent.
inline constexpr const char* kLogLinePrefixTemplate = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE";
inline constexpr const char* kPython = "PYTHON";
// torchrun's name for the interpreter; wins over PYTHON.
inline constexpr const char* kPythonExec = "PYTHON_EXEC";
inline constexpr const char* kLogLevel = "DDPRUN_LOG_LEVEL";
// A boolean; 1/true/yes: workers are contained by process groups only, even where cgroups v2 can be written.
inline constexpr const char* kNoCgroups = "DDPRUN_NO_CGROUPS";
// The rendezvous store's shared token (the agent, the store server, `ddprun status`).
inline constexpr const char* kToken = "DDPRUN_TOKEN";
// Where the agent appends its events too (one JSON object a line), besides the run directory.
inline constexpr const char* kEventsFile = "DDPRUN_EVENTS_FILE";
// Only for tests: a directory standing in for "/" when reading sysfs (and
// /proc/driver/nvidia), so that a test can describe a multi-socket host. When set, NVML is
// not asked about GPUs either.
inline constexpr const char* kTopologyRoot = "DDPRUN_TOPOLOGY_ROOT";
// The NVML library the agent and `--nproc_per_node=gpu` open, a path or a name for the
// loader (default libnvidia-ml.so.1): a driver outside the loader's path, or the tests'
// fake NVML.
inline constexpr const char* kNvmlLibrary = "DDPRUN_NVML_LIBRARY";
// Only for tests: a file standing in for /dev/kmsg, where the agent reads the NVIDIA
// driver's lines about a GPU fault (NVRM: Xid ...).
inline constexpr const char* kKernelLog = "DDPRUN_KERNEL_LOG";
// Set by scripts/ddprun-slurm when it starts the per-node step itself from a batch
// script: the job's SLURM_TASKS_PER_NODE, which srun replaces with the step's own.
inline constexpr const char* kSlurmJobTasksPerNode = "DDPRUN_SLURM_JOB_TASKS_PER_NODE";
// torch's agent settings, honoured by ddprun when the flag is not given.
inline constexpr const char* kShutdownTimeout = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT";
inline constexpr const char* kHealthCheckPort = "TORCHELASTIC_HEALTH_CHECK_PORT";
// Intel GPUs' CUDA_VISIBLE_DEVICES, counted by --nproc_per_node=gpu.
inline constexpr const char* kZeAffinityMask = "ZE_AFFINITY_MASK";
// 1: the agent serves torch's file timers (kTimerFile), as torchrun's agent does.
inline constexpr const char* kEnableFileTimer = "TORCHELASTIC_ENABLE_FILE_TIMER";

}  // namespace ddprun::env
