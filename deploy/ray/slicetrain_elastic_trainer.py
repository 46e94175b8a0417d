#!/usr/bin/env python3
"""slicetrain under Ray Train v2: the counterpart of the tutorial's
maxtext_elastic_trainer.py (docs/ray.md).

    ray job submit --address http://localhost:8265 --working-dir . \\
        --runtime-env-json '{"excludes": [".git"]}' \\
        -- python slicetrain_elastic_trainer.py base.yml base_output_directory=/data/ \\
           run_name=rayjob-elastic-8b ...

What Ray does: it places one Ray Train worker per host (ScalingConfig with
num_workers=(min, max) in hosts, one "slicetrain_host" resource per host),
restarts the whole group on a failure (FailureConfig(max_failures)) and
resizes it when hosts come and go (elastic_resize_monitor_interval_s).

What this script does on each (re)start of the group: it rounds the Ray
workers down to whole slices (hosts_per_slice hosts each, grouped by
SLICETRAIN_SLICE_NAME when a slice has several hosts), and each Ray worker
of those slices runs one `slicetrain train` process per device of its host,
with SLICETRAIN_RANK / WORLD_SIZE / COORDINATOR / NUM_SLICES / SLICE_ID set
from that plan. slicetrain resolves the mesh for that many slices (DCN axes
given as -1), resumes from the newest checkpoint under
<base_output_directory>/<run_name>/checkpoints, and keeps the global batch
of the largest group (SLICETRAIN_ELASTIC_MAX_DEVICES). Rank 0's step lines
go to `ray job logs` and to ray.train.report.

Processes: every slicetrain process runs in its own session with
PR_SET_PDEATHSIG(SIGKILL) tied to the Ray worker that started it, and the
worker SIGKILLs their process groups when its training function ends: when
Ray kills a worker (a lost node, a resize, `ray job stop`), nothing is left.
Before Ray kills a group it calls the workers' shutdown hook (up to 5 s):
the hook asks slicetrain to save at the step boundary (SIGUSR1), so a resize
or a stop loses no completed step when a step and a save fit in that time.

The run token: each node's environment names it (SLICETRAIN_TOKEN_FILE, a
0600 file: a mounted Secret in Kubernetes); the processes inherit the path.
It never goes through runtime_env, the job's arguments or a log line.

Options (before the config file; each also from the environment of the job's
driver, SLICETRAIN_RAY_<NAME>, e.g. SLICETRAIN_RAY_HOSTS_PER_SLICE=1):
  --min-slices N            smallest group, in slices (default 1)
  --max-slices N            largest group, in slices (default 2)
  --hosts-per-slice N       Ray workers (hosts) per slice (default 4, the tutorial's v6e-16)
  --devices-per-host N      slicetrain processes per host (default 4)
  --threads-per-device N    OMP_NUM_THREADS of each process (default: the worker's
                            Ray CPUs / devices per host, at least 1)
  --max-failures N          FailureConfig(max_failures) (default 3; -1 unlimited)
  --resources-per-worker J  JSON (default {"CPU": 1, "slicetrain_host": 1})
  --start-timeout S         RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S (default 10; Ray's 60)
  --resize-interval S       elastic_resize_monitor_interval_s (default 10; Ray's 60)
  --report-interval S       seconds between ray.train.report rounds (default 2)
Node environment (Ray workers inherit their node's): SLICETRAIN_BIN (the
binary; default `slicetrain` on PATH), SLICETRAIN_TOKEN_FILE (required),
SLICETRAIN_SLICE_NAME (which slice this host belongs to; needed when a slice
has several hosts), SLICETRAIN_ADDR (the address peers reach this host at;
default Ray's node IP).

Exit status: 0 done; 2 bad input (config, options, missing run token);
3 the run failed (failures over --max-failures); 143 stopped (`ray job stop`).
"""
import argparse
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

# Ray's driver folds lines that differ only in numbers across workers (its
# log deduplication): a restarted worker's step lines would be folded into
# "[repeated Nx across cluster]". Every step line is wanted in the job's log.
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

import ray  # noqa: E402
import ray.train  # noqa: E402
import ray.train.collective  # noqa: E402
from ray.train.v2.api.config import FailureConfig, RunConfig, ScalingConfig  # noqa: E402
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

try:  # the workers' shutdown hook (DeveloperAPI of Ray Train v2, pinned 2.60.0)
    from ray.train.v2._internal.execution.callback import WorkerCallback
except ImportError:  # pragma: no cover - a Ray without it: stops are SIGKILLs
    WorkerCallback = None

EXIT_BAD_INPUT, EXIT_FAILED, EXIT_STOPPED = 2, 3, 143
# slicetrain's exit statuses (README): 0 done, 2 bad input, 3 a peer failed,
# 128+N a signal; 138 = SIGUSR1 (a resize request: saved and stopped).
ST_EXIT_RESIZED = 128 + signal.SIGUSR1
STEP_RE = re.compile(
    r"^completed step: (\d+), seconds: ([0-9.]+), TFLOP/s/device: ([0-9.]+), "
    r"Tokens/s/device: ([0-9.]+), total_weights: (\d+), loss: ([0-9.eE+-]+|nan|inf)")
PR_SET_PDEATHSIG = 1


def log(msg, stream=None):
    """One line of ours in the job's log, prefixed so it can be found (not
    print(): Ray Train's workers echo what print() writes a second time)."""
    out = stream or sys.stdout
    out.write(f"slicetrain ray: {msg}\n")
    out.flush()


# ---------------------------------------------------------------------------
# The plan of one (re)start: which Ray workers form which slices.

def plan_group(members, hosts_per_slice, devices_per_host, usable, max_slices):
    """The worker group of one start, from what each Ray worker said of itself.

    members: one dict per Ray world rank (index = rank) with "slice" (the
    node's SLICETRAIN_SLICE_NAME, "" when not given), "host_index" (int or
    None), "addr" and "port" (where this worker's coordinator would listen).
    usable: the slice counts the mesh resolves for, ascending.

    Slices are whole: hosts_per_slice Ray workers with the same slice name
    (with one host per slice every worker is a slice; several hosts per
    slice and no names: consecutive ranks, and a warning). The slice holding
    Ray rank 0 comes first, then by lowest rank; hosts by host_index when
    every host of the slice has one, else by rank. The group is the largest
    usable count of whole slices, at most max_slices. Returns a dict:
      slices      the chosen slices' Ray ranks, host order ([[r, ...], ...])
      num_slices  len(slices) (0: none usable)
      world       num_slices * hosts_per_slice * devices_per_host
      role        {ray_rank: (slice_id, host)} for the workers that train
      idle        Ray ranks left out, ascending
      coordinator "addr:port" of slice 0 host 0 (None when num_slices is 0)
      whole       whole slices available before the usable/max cut
      warning     a line to print, or None
    """
    H, D = hosts_per_slice, devices_per_host
    warning = None
    ranks = list(range(len(members)))
    if H == 1:
        groups = [[r] for r in ranks]
    elif all(m.get("slice") for m in members):
        by_name = {}
        for r in ranks:
            by_name.setdefault(members[r]["slice"], []).append(r)
        too_many = [n for n, rs in by_name.items() if len(rs) > H]
        if too_many:
            raise ValueError(f"slice {too_many[0]!r} has {len(by_name[too_many[0]])} Ray workers, more than "
                             f"its {H} hosts: one Ray worker per host (resources_per_worker names a per-host "
                             "resource, slicetrain_host)")
        groups = list(by_name.values())
    else:
        groups = [ranks[i:i + H] for i in range(0, len(ranks), H)]
        if len(members) > 1:
            warning = (f"{H} hosts per slice, and not every node names its slice (SLICETRAIN_SLICE_NAME): "
                       "slices are taken as consecutive Ray ranks")
    whole = []
    for g in groups:
        if len(g) != H:
            continue
        if all(isinstance(members[r].get("host_index"), int) for r in g):
            g = sorted(g, key=lambda r: (members[r]["host_index"], r))
            if len({members[r]["host_index"] for r in g}) != H:
                g = sorted(g)
        whole.append(g)
    whole.sort(key=lambda g: (0 not in g, min(g)))
    avail = min(len(whole), max_slices)
    fits = [k for k in usable if k <= avail]
    k = fits[-1] if fits else 0
    chosen = whole[:k]
    role = {r: (s, h) for s, g in enumerate(chosen) for h, r in enumerate(g)}
    coordinator = None
    if chosen:
        lead = members[chosen[0][0]]
        coordinator = join_hostport(lead["addr"], lead["port"])
    return {
        "slices": chosen,
        "num_slices": k,
        "world": k * H * D,
        "role": role,
        "idle": sorted(set(ranks) - set(role)),
        "coordinator": coordinator,
        "whole": len(whole),
        "warning": warning,
    }


def join_hostport(host, port):
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def slicetrain_env(base_env, *, rank, world, local_rank, coordinator, num_slices, slice_id, max_devices,
                   generation, threads):
    """The environment of one slicetrain process: the node's, minus Ray's own
    secrets and other launchers' group variables, plus the group's place."""
    env = {k: v for k, v in base_env.items()
           if not k.startswith(("RAY_AUTH_", "SLICETRAIN_RAY_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update({
        "SLICETRAIN_RANK": str(rank),
        "SLICETRAIN_WORLD_SIZE": str(world),
        "SLICETRAIN_LOCAL_RANK": str(local_rank),
        "SLICETRAIN_COORDINATOR": coordinator,
        "SLICETRAIN_NUM_SLICES": str(num_slices),
        "SLICETRAIN_SLICE_ID": str(slice_id),
        "SLICETRAIN_ELASTIC_MAX_DEVICES": str(max_devices),
        "SLICETRAIN_GENERATION": str(generation),
        "OMP_NUM_THREADS": str(threads),
    })
    return env


def check_token_file(env):
    """The run token's file, as slicetrain will check it: named, a regular
    file, nothing for group or others. Returns the path; raises ValueError."""
    path = env.get("SLICETRAIN_TOKEN_FILE")
    if not path:
        raise ValueError("SLICETRAIN_TOKEN_FILE is not set on this node: every process of a run needs the run "
                         "token (a 0600 file; in Kubernetes a mounted Secret, docs/ray.md)")
    try:
        st = os.stat(path)
    except OSError as e:
        raise ValueError(f"SLICETRAIN_TOKEN_FILE={path}: {e.strerror}") from None
    if not os.path.isfile(path):
        raise ValueError(f"SLICETRAIN_TOKEN_FILE={path} is not a regular file")
    if st.st_mode & 0o077:
        raise ValueError(f"SLICETRAIN_TOKEN_FILE={path} has mode {st.st_mode & 0o777:04o}: "
                         "it must grant nothing to group or others (0600 or 0400)")
    return path


def parse_step_line(line):
    """MaxText's step line as slicetrain prints it -> metrics, or None."""
    m = STEP_RE.match(line)
    if not m:
        return None
    return {
        "step": int(m.group(1)),
        "perf/step_time_seconds": float(m.group(2)),
        "perf/per_device_tflops_per_sec": float(m.group(3)),
        "perf/per_device_tokens_per_sec": float(m.group(4)),
        "learning/total_weights": int(m.group(5)),
        "learning/loss": float(m.group(6)),
    }


# ---------------------------------------------------------------------------
# The run's bookkeeping: one small actor on the driver's node.

@ray.remote(num_cpus=0)
class RunControl:
    """Shared by the driver and every worker of every attempt: the
    membership of each start (who is where), the step records of its lead,
    and the attempts' timeline for the summary."""

    def __init__(self):
        self.members = {}    # attempt -> {ray_rank: info}
        self.attempts = []   # in start order: dicts (see attempt_started)
        self.by_id = {}

    def join(self, attempt, rank, info):
        self.members.setdefault(attempt, {})[rank] = info

    def get_members(self, attempt, world):
        m = self.members.get(attempt, {})
        return [m.get(r) for r in range(world)]

    def attempt_started(self, attempt, info):
        rec = dict(info, attempt=attempt, index=len(self.attempts) + 1, start=time.time(), first_step=None,
                   first_step_time=None, last_step=None, last_step_time=None, latest=None, finished=False)
        self.attempts.append(rec)
        self.by_id[attempt] = rec
        # (the members stay: other workers may still be reading them; a few
        # hundred bytes a start)
        return rec["index"]

    def step(self, attempt, record):
        a = self.by_id.get(attempt)
        if a is None:
            return
        now = time.time()
        if a["first_step"] is None:
            a["first_step"], a["first_step_time"] = record["step"], now
        a["last_step"], a["last_step_time"], a["latest"] = record["step"], now, record

    def finish(self, attempt):
        if attempt in self.by_id:
            self.by_id[attempt]["finished"] = True

    def latest(self, attempt):
        a = self.by_id.get(attempt)
        return (a["latest"], a["finished"]) if a else (None, False)

    def timeline(self):
        return self.attempts


# ---------------------------------------------------------------------------
# The slicetrain processes of one Ray worker.

def _child_setup(prctl, parent):
    """In the child, before exec (no locks taken, nothing allocated): die
    with the Ray worker that started us; if it is already gone, go."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


class LocalProcs:
    """The slicetrain processes of this host: started, forwarded, killed."""

    def __init__(self, on_step=None):
        self.procs = []       # (slicetrain rank, Popen)
        self.threads = []
        self.on_step = on_step
        self.lock = threading.Lock()

    def start(self, exe, args, envs, ranks, lead_rank):
        # PR_SET_PDEATHSIG is tied to the thread that forks: this one, the
        # training function's, which lives as long as the processes matter
        parent, prctl = os.getpid(), ctypes.CDLL(None, use_errno=True).prctl
        for rank, env in zip(ranks, envs):
            p = subprocess.Popen([exe, "train", *args], env=env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                 preexec_fn=lambda: _child_setup(prctl, parent), close_fds=True)
            self.procs.append((rank, p))
            for stream, out in ((p.stdout, sys.stdout), (p.stderr, sys.stderr)):
                t = threading.Thread(target=self._forward, args=(rank, stream, out, rank == lead_rank
                                                                 and out is sys.stdout), daemon=True)
                t.start()
                self.threads.append(t)

    def _forward(self, rank, stream, out, parse):
        prefix = "" if rank == 0 else f"[rank {rank}] "
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self.lock:
                out.write(prefix + line + "\n")
                out.flush()
            if parse and self.on_step:
                rec = parse_step_line(line)
                if rec:
                    self.on_step(rec)
        stream.close()

    def poll(self):
        """[(rank, exit status or None)]"""
        return [(r, p.poll()) for r, p in self.procs]

    def wait_all(self, timeout):
        """Wait for every process to end (at most timeout s) and for the
        last of their output; True when all ended."""
        deadline = time.monotonic() + timeout
        for _, p in self.procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return False
        for t in self.threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        return True

    def signal_all(self, sig):
        for _, p in self.procs:
            if p.poll() is None:
                try:
                    os.kill(p.pid, sig)
                except ProcessLookupError:
                    pass

    def kill(self):
        """SIGKILL every process group we started, reap, drain the output."""
        for _, p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for _, p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for t in self.threads:
            t.join(timeout=2)


def _my_slicetrain_children():
    """Pids of this process's children running slicetrain (found in /proc,
    so that the shutdown hook needs no state shared with the train function)."""
    me, found = os.getpid(), []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == me and os.path.basename(os.readlink(f"/proc/{d}/exe")).startswith("slicetrain"):
                found.append(int(d))
        except (OSError, ValueError, IndexError):
            continue
    return found


if WorkerCallback is not None:
    class SaveBeforeShutdown(WorkerCallback):
        """Ray calls this on every worker before it kills the group (a resize,
        a restart after a failure, an abort), and waits up to 5 s: ask the
        slicetrain processes to save at the step boundary and stop (SIGUSR1,
        exit 138), and wait for them, 4.5 s at most."""

        def before_worker_shutdown(self):
            pids = _my_slicetrain_children()
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGUSR1)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 4.5
            while pids and time.monotonic() < deadline:
                pids = [p for p in pids if os.path.exists(f"/proc/{p}") and not _is_zombie(p)]
                time.sleep(0.05)


def _is_zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _free_port(addr):
    fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def _env_int(name):
    v = os.environ.get(name)
    try:
        return int(v) if v not in (None, "") else None
    except ValueError:
        return None


def train_loop_per_worker(config):
    """One Ray worker = one host: plan the group, run this host's slicetrain
    processes, report the lead's steps, until the run is done."""
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    control = config["control"]
    H, D = config["hosts_per_slice"], config["devices_per_host"]
    attempt = ray.train.collective.broadcast_from_rank_zero(uuid.uuid4().hex if rank == 0 else None)

    addr = os.environ.get("SLICETRAIN_ADDR") or ray.util.get_node_ip_address()
    me = {"slice": os.environ.get("SLICETRAIN_SLICE_NAME", ""), "host_index": _env_int("SLICETRAIN_HOST_INDEX"),
          "addr": addr, "port": _free_port(addr), "hostname": socket.gethostname()}
    ray.get(control.join.remote(attempt, rank, me))
    ray.train.collective.barrier()
    members = ray.get(control.get_members.remote(attempt, world))
    plan = plan_group(members, H, D, config["usable"], config["max_slices"])
    if plan["num_slices"] < config["min_slices"]:
        raise RuntimeError(f"{world} Ray workers make {plan['whole']} whole slice(s) of {H} host(s), and the "
                           f"run needs at least {config['min_slices']} (--min-slices)")
    index = None
    if rank == 0:
        index = ray.get(control.attempt_started.remote(attempt, {
            "ray_workers": world, "slices": plan["num_slices"], "world": plan["world"],
            "coordinator": plan["coordinator"], "idle": plan["idle"]}))
        if plan["warning"]:
            log(f"warning: {plan['warning']}")
        idle = (f"; Ray workers {plan['idle']} idle (not whole slices, or over the largest usable count)"
                if plan["idle"] else "")
        log(f"start {index}: {world} Ray workers -> {plan['num_slices']} slice(s) x {H} host(s) x {D} "
            f"device(s) = {plan['world']} slicetrain processes, coordinator {plan['coordinator']}{idle}")
    index = ray.train.collective.broadcast_from_rank_zero(index)

    procs = LocalProcs(on_step=lambda rec: control.step.remote(attempt, rec))
    role = plan["role"].get(rank)
    try:
        if role is not None:
            s, h = role
            check_token_file(os.environ)  # the path only: slicetrain reads the file itself
            first = (s * H + h) * D
            ranks = list(range(first, first + D))
            threads = config["threads_per_device"]
            if not threads:
                cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1)
                threads = max(1, int(cpus) // D)
            envs = [slicetrain_env(os.environ, rank=r, world=plan["world"], local_rank=r - first,
                                   coordinator=plan["coordinator"], num_slices=plan["num_slices"], slice_id=s,
                                   max_devices=config["max_slices"] * H * D, generation=index, threads=threads)
                    for r in ranks]
            exe = os.environ.get("SLICETRAIN_BIN") or shutil.which("slicetrain")
            if not exe:
                raise RuntimeError("no slicetrain binary on this node (set SLICETRAIN_BIN or put it on PATH)")
            procs.start(exe, config["args"], envs, ranks, lead_rank=0)
        _supervise(procs, control, attempt, rank, role is not None and role == (0, 0), config["report_interval"])
    finally:
        procs.kill()


def _supervise(procs, control, attempt, rank, is_lead, interval):
    """Until the run is done: local exits checked every 0.1 s; every
    `interval` s a report round in which every Ray worker takes part
    (ray.train.report is collective: rank 0 says what to report, so every
    worker reports as often). After the round that says the lead finished
    there is no collective call: each worker waits for its own processes."""
    reported = None
    next_round = time.monotonic() + interval
    local_done = not procs.procs
    while True:
        for r, st in procs.poll():
            if st is None or st == 0:
                continue
            if st in (ST_EXIT_RESIZED, -signal.SIGUSR1):  # -SIGUSR1: asked before its handler was set
                # Ray's shutdown hook asked them to save and stop; let the
                # others finish their part of the save, then Ray ends us
                procs.wait_all(5)
                return
            raise RuntimeError(f"slicetrain rank {r} exited with status {st}"
                               + (" (a peer of the group failed)" if st == 3 else ""))
        if not local_done and all(st == 0 for _, st in procs.poll()):
            local_done = True
            if is_lead:
                procs.wait_all(10)  # every step line is read (and sent) before the finish
                ray.get(control.finish.remote(attempt))
        if time.monotonic() < next_round:
            time.sleep(0.1)
            continue
        next_round = time.monotonic() + interval
        view = ray.get(control.latest.remote(attempt)) if rank == 0 else None
        latest, finished = ray.train.collective.broadcast_from_rank_zero(view)
        if latest is not None and latest != reported:
            ray.train.report(dict(latest))
            reported = latest
        if finished:
            break
    while not local_done:
        for r, st in procs.poll():
            if st not in (None, 0):
                raise RuntimeError(f"slicetrain rank {r} exited with status {st} after the run's last step")
        local_done = all(st == 0 for _, st in procs.poll())
        time.sleep(0.1)


# ---------------------------------------------------------------------------
# The driver.

def _config_value(args, config_path, key):
    """A key's value: the last key=value override, else the config file's
    top level (MaxText's precedence), else None."""
    val = None
    for a in args:
        if a.startswith(key + "="):
            val = a[len(key) + 1:]
    if val is not None:
        return val
    if config_path:
        try:
            import yaml
            with open(config_path) as f:
                doc = yaml.safe_load(f) or {}
            v = doc.get(key) if isinstance(doc, dict) else None
            return None if v is None else str(v)
        except (OSError, ImportError, ValueError):
            return None
    return None


DCN_KEYS = ("dcn_data_parallelism", "dcn_fsdp_parallelism", "dcn_tensor_parallelism")
MESH_RE = re.compile(r"mesh: .*data \d+ \(ici \d+, dcn (\d+)\), fsdp \d+ \(ici \d+, dcn (\d+)\), "
                     r"tensor \d+ \(ici \d+, dcn (\d+)\)")


def _usable_slice_counts(exe, config_path, overrides, lo, hi, devices_per_slice):
    """The slice counts in [lo, hi] the mesh resolves for, as the native
    controller decides (src/elastic/controller.c, mesh_for): `slicetrain plan`
    resolves it, and a DCN axis given explicitly (not -1) must be what the
    mesh of that count has. Returns (counts, {count: why not})."""
    usable, why = [], {}
    given = {}
    for key in DCN_KEYS:
        v = _config_value(overrides, config_path, key)
        if v not in (None, "", "-1"):
            given[key] = v
    for k in range(lo, hi + 1):
        cmd = [exe, "plan", *([config_path] if config_path else []), *overrides, "--num-slices", str(k),
               "--devices-per-slice", str(devices_per_slice)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        m = MESH_RE.search(r.stdout)
        if r.returncode != 0 or not m:
            why[k] = " ".join(line for line in r.stderr.splitlines() if "error" in line) or f"exit {r.returncode}"
            continue
        bad = [f"{key}={given[key]} does not fit {k} slice{'' if k == 1 else 's'} (elastic runs give their DCN "
               "axes as -1)" for key, dcn in zip(DCN_KEYS, m.groups()) if key in given and given[key] != dcn]
        if bad:
            why[k] = bad[0]
        else:
            usable.append(k)
    return usable, why


def parse_args(argv):
    env = os.environ

    def dflt(name, v):
        return env.get("SLICETRAIN_RAY_" + name.upper().replace("-", "_"), v)

    p = argparse.ArgumentParser(prog="slicetrain_elastic_trainer.py",
                                description="slicetrain under Ray Train v2 (docs/ray.md)",
                                usage="%(prog)s [options] CONFIG.yml [key=value ...]")
    p.add_argument("--min-slices", type=int, default=int(dflt("min-slices", 1)))
    p.add_argument("--max-slices", type=int, default=int(dflt("max-slices", 2)))
    p.add_argument("--hosts-per-slice", type=int, default=int(dflt("hosts-per-slice", 4)))
    p.add_argument("--devices-per-host", type=int, default=int(dflt("devices-per-host", 4)))
    p.add_argument("--threads-per-device", type=int, default=int(dflt("threads-per-device", 0)))
    p.add_argument("--max-failures", type=int, default=int(dflt("max-failures", 3)))
    p.add_argument("--resources-per-worker", default=dflt("resources-per-worker",
                                                          '{"CPU": 1, "slicetrain_host": 1}'))
    p.add_argument("--start-timeout", type=float, default=float(dflt("start-timeout", 10)))
    p.add_argument("--resize-interval", type=float, default=float(dflt("resize-interval", 10)))
    p.add_argument("--report-interval", type=float, default=float(dflt("report-interval", 2)))
    p.add_argument("rest", nargs=argparse.REMAINDER, metavar="CONFIG.yml [key=value ...]")
    a = p.parse_args(argv)
    try:
        a.resources = json.loads(a.resources_per_worker)
        assert isinstance(a.resources, dict) and all(isinstance(v, (int, float)) for v in a.resources.values())
    except (ValueError, AssertionError):
        p.error(f"--resources-per-worker: not a JSON object of numbers: {a.resources_per_worker}")
    for name in ("min_slices", "max_slices", "hosts_per_slice", "devices_per_host"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if a.min_slices > a.max_slices:
        p.error(f"--min-slices {a.min_slices} is larger than --max-slices {a.max_slices}")
    if a.max_failures < -1 or a.threads_per_device < 0:
        p.error("--max-failures is -1 or more, --threads-per-device 0 (automatic) or more")
    return a


def main(argv):
    a = parse_args(argv)
    rest = list(a.rest)
    config_path = None
    if rest and rest[0].endswith((".yml", ".yaml")):
        # the tutorial makes the config path absolute: the workers run elsewhere
        config_path = os.path.abspath(rest.pop(0))
        if not os.path.isfile(config_path):
            log(f"error: no config file {config_path}", sys.stderr)
            return EXIT_BAD_INPUT
    bad = [x for x in rest if "=" not in x]
    if bad:
        log(f"error: not key=value: {bad[0]!r} (options go before the config file)", sys.stderr)
        return EXIT_BAD_INPUT
    overrides = rest

    base = _config_value(overrides, config_path, "base_output_directory") or ""
    if not base:
        log("error: set base_output_directory to a directory every node shares (the tutorial's /data/): "
            "checkpoints live there and every restart resumes from them", sys.stderr)
        return EXIT_BAD_INPUT
    if not os.path.isabs(base):
        log(f"error: base_output_directory={base} is relative: the workers run in other directories; "
            "give an absolute path every node shares", sys.stderr)
        return EXIT_BAD_INPUT
    ckpt = (_config_value(overrides, config_path, "enable_checkpointing") or "true").lower()
    if ckpt in ("false", "0", "no"):
        log("error: enable_checkpointing is false: every Ray restart would start over", sys.stderr)
        return EXIT_BAD_INPUT
    run_name = _config_value(overrides, config_path, "run_name") or ""
    if not run_name:
        # pinned once here (MaxText's derivation) so that every restart resumes the same run
        model = _config_value(overrides, config_path, "model_name") or "default"
        run_name = os.environ.get("JOBSET_NAME") or f"{model}_{time.strftime('%Y-%m-%d-%H-%M', time.gmtime())}"
        overrides.append(f"run_name={run_name}")
        log(f"run_name is not set: using run_name={run_name} for every restart")

    H, D = a.hosts_per_slice, a.devices_per_host
    exe = os.environ.get("SLICETRAIN_BIN") or shutil.which("slicetrain")
    usable = list(range(a.min_slices, a.max_slices + 1))
    if exe:
        usable, why = _usable_slice_counts(exe, config_path, overrides, a.min_slices, a.max_slices, H * D)
        for k, msg in why.items():
            log(f"{k} slice(s) of {H * D} devices: not usable: {msg}")
        if a.min_slices not in usable or a.max_slices not in usable:
            reasons = "; ".join(f"{k}: {why[k]}" for k in sorted({a.min_slices, a.max_slices}) if k in why)
            log(f"error: the mesh must resolve for --min-slices {a.min_slices} and --max-slices {a.max_slices} "
                f"(slices of {H * D} devices): {reasons}", sys.stderr)
            return EXIT_BAD_INPUT
    else:
        log("warning: no slicetrain binary on the driver's node (SLICETRAIN_BIN): the config is checked "
            "by the workers only")

    # Ray's tunables: the controller reads them from the driver's environment
    os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", str(a.start_timeout))
    if not ray.is_initialized():
        ray.init()  # under `ray job submit`: the job's cluster
    control = RunControl.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        ray.get_runtime_context().get_node_id(), soft=False)).remote()

    trainer = DataParallelTrainer(
        train_loop_per_worker=train_loop_per_worker,
        train_loop_config={
            "args": ([config_path] if config_path else []) + overrides,
            "control": control,
            "hosts_per_slice": H,
            "devices_per_host": D,
            "threads_per_device": a.threads_per_device,
            "min_slices": a.min_slices,
            "max_slices": a.max_slices,
            "usable": usable,
            "report_interval": a.report_interval,
        },
        scaling_config=ScalingConfig(
            # Ray workers are hosts: whole slices from min to max
            num_workers=(a.min_slices * H, a.max_slices * H),
            resources_per_worker=a.resources,
            placement_strategy="SPREAD",
            elastic_resize_monitor_interval_s=a.resize_interval,
        ),
        run_config=RunConfig(
            name=run_name,
            storage_path=base,  # one root: Ray's run state beside slicetrain's checkpoints
            failure_config=FailureConfig(max_failures=a.max_failures),
            callbacks=[SaveBeforeShutdown()] if WorkerCallback is not None else None,
        ),
    )
    log(f"run {run_name}: {a.min_slices}..{a.max_slices} slice(s) of {H} host(s) x {D} device(s); Ray workers "
        f"{a.min_slices * H}..{a.max_slices * H}, each {a.resources}; checkpoints in "
        f"{os.path.join(base, run_name, 'checkpoints')}; max_failures {a.max_failures}; start timeout "
        f"{os.environ['RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S']} s, resize interval {a.resize_interval} s")

    # `ray job stop` sends SIGTERM: abort the run as Ctrl-C does (Ray's own
    # handler), which calls the workers' shutdown hook: slicetrain saves.
    stopping = []

    def on_sigterm(signum, frame):
        stopping.append(signum)
        h = signal.getsignal(signal.SIGINT)
        if callable(h):
            h(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    status = 0
    try:
        trainer.fit()
    except KeyboardInterrupt:
        status = EXIT_STOPPED
    except Exception as e:  # TrainingFailedError: failures over the budget
        log(f"the run failed: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}",
            sys.stderr)
        status = EXIT_FAILED
    if stopping:
        status = EXIT_STOPPED
    try:
        print_summary(ray.get(control.timeline.remote(), timeout=10))
    except Exception:  # noqa: BLE001 - the summary is a courtesy
        pass
    return status


def print_summary(attempts):
    """One line per start: its size, where it resumed, the steps it trained
    again, and the gap since the previous start's last step; then the run's."""
    kept_to = None
    lines = []
    for a in attempts:
        first, last = a["first_step"], a["last_step"]
        retrained = 0 if kept_to is None or first is None else max(0, kept_to - first + 1)
        gap = None
        if lines and a["first_step_time"] is not None and lines[-1]["last_step_time"] is not None:
            gap = a["first_step_time"] - lines[-1]["last_step_time"]
        rec = {"event": "ray_start", "start": a["index"], "ray_workers": a["ray_workers"], "slices": a["slices"],
               "world": a["world"], "first_step": first, "last_step": last, "retrained": retrained,
               "gap_s": None if gap is None else round(gap, 2), "finished": a["finished"],
               "last_step_time": a["last_step_time"], "first_step_time": a["first_step_time"],
               "start_time": a["start"]}
        lines.append(rec)
        if last is not None:
            kept_to = last if kept_to is None else max(kept_to, last)
    for rec in lines:
        print(json.dumps({k: v for k, v in rec.items() if not k.endswith("_time")}), flush=True)
    print(json.dumps({"event": "ray_summary", "starts": len(lines),
                      "resizes": sum(1 for x, y in zip(lines, lines[1:]) if x["slices"] != y["slices"]),
                      "retrained": [r["retrained"] for r in lines[1:]],
                      "gaps_s": [r["gap_s"] for r in lines[1:]],
                      "timeline": [[r["start_time"], r["first_step_time"], r["last_step_time"]] for r in lines]}),
          flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
