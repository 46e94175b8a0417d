# The tutorial's elastic run on a real local Ray cluster (docs/ray.md,
# deploy/README.md): a head and 2 one-CPU nodes (each one host of its own
# slice) from deploy/ray/local-cluster.sh, token auth on.
#  1. `ray list nodes` lists the head and the 2 nodes, ALIVE.
#  2. The job is submitted with `ray job submit ... -- python
#     slicetrain_elastic_trainer.py base.yml key=value...` as the README shows
#     (llama3-test, 16 x 512 tokens per device, 300 steps, checkpoint_period 5).
#  3. While it trains on 2 slices: the cluster's namespace has only a loopback
#     interface and every slicetrain listening socket is on 127.0.0.1; the
#     rendezvous store and the transports refuse a client without the run
#     token and one with another token (a client with the right one is
#     answered: the probe is right); the run trains on.
#  4. kill -9 of node 2's raylet at step 15: node 2's slicetrain process is
#     gone within 10 s (no orphan); Ray restarts the group on 1 slice, which
#     resumes from the newest checkpoint; `ray list nodes` shows node 2 DEAD.
#  5. node 2 started again: the group grows back to 2 slices.
#  6. The job ends SUCCEEDED (`ray job submit` exits 0, `ray job status`);
#     the kept history holds every step once (the steps each restart trained
#     again are counted and match the trainer's summary); the final weights
#     are within 1e-4 relative (per tensor, by norm) of a fault-free
#     `slicetrain launch` run of the same 300 steps on 2 slices, and said
#     whether bit-identical; no slicetrain process is left.
#  7. Recovery times (kill -> first step on 1 slice, node back -> first step
#     on 2 slices) next to Ray's defaults measured on this machine.
#  8. The run token is in no log, no job's entrypoint or runtime_env; the
#     Ray token: a wrong one, none, and a bare HTTP request are refused.
# timeout: 900
. "$(dirname "$0")/lib.sh"
cluster_up --nodes 2 --cpus 1
make_workdir
steps=${ST_RAY_STEPS:-300} # long enough for a grow before the end (more with Ray's default intervals)
run=rayjob-elastic

echo "== 1. ray list nodes --address $ADDRESS"
ray list nodes --address "$ADDRESS" >"$TMP/nodes.txt" 2>&1 || fail "ray list nodes failed: $(tail -3 "$TMP/nodes.txt")"
grep -E "^ *[0-9]+ +[0-9a-f]{56} " "$TMP/nodes.txt" | awk '{print "  " $1, substr($2, 1, 12) "...", $3, "head=" $4, $5}'
ray list nodes --address "$ADDRESS" --format json 2>/dev/null | "$PY" -c '
import json, sys
n = json.load(sys.stdin)
alive = [x for x in n if x["state"] == "ALIVE"]
heads = [x for x in alive if x["is_head_node"]]
hosts = [x for x in alive if x["resources_total"].get("slicetrain_host") == 1]
print(f"  {len(alive)} nodes ALIVE: {len(heads)} head, {len(hosts)} with slicetrain_host 1")
sys.exit(not (len(heads) == 1 and len(hosts) == 2))' || fail "ray list nodes: want the head and 2 slicetrain hosts ALIVE"

echo "== 2. ray job submit (as the README shows)"
keys=(base.yml base_output_directory="$DATA/" dataset_type=synthetic per_device_batch_size=16 max_target_length=512
	model_name=llama3-test steps=$steps checkpoint_period=5 run_name=$run metrics_file="$DATA/$run.jsonl")
echo "  cd work && ray job submit --address $ADDRESS --working-dir . --runtime-env-json '{\"excludes\": [\".git\"]}' \\"
echo "      -- python slicetrain_elastic_trainer.py ${keys[*]}"
(cd "$TMP/work" && exec ray job submit --address "$ADDRESS" --working-dir . --runtime-env-json '{"excludes": [".git"]}' \
	-- python slicetrain_elastic_trainer.py "${keys[@]}") >"$TMP/submit.out" 2>&1 &
submit=$!
at_step() { [ "$(last_step "$DATA/$run.jsonl")" -ge "$1" ]; }
wait_for 180 "step 15" at_step 15 || { tail -30 "$TMP/submit.out"; finish; }
id=$(job_id "$TMP/submit.out")
echo "  job $id: step $(last_step "$DATA/$run.jsonl") done; status $(job_status "$id")"

echo "== 3. loopback only; the run token refused when wrong or missing"
ifaces=$("$CLUSTER" exec ip -o link | awk -F': ' '{print $2}' | paste -sd ' ')
echo "  the cluster's network namespace: interfaces: $ifaces"
[ "$ifaces" = lo ] || fail "the cluster's namespace has interfaces other than lo: $ifaces"
pids=$(st_pids)
[ "$(echo $pids | wc -w)" = 2 ] || fail "want 2 slicetrain processes, found: $pids"
"$PY" - $pids >"$TMP/listen.txt" <<'PY' || fail "a slicetrain process listens beyond loopback: $(cat "$TMP/listen.txt")"
import ipaddress, os, socket, struct, sys
bad = 0
for pid in sys.argv[1:]:
    inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")
              if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")}
    for f, fam in ((f"/proc/{pid}/net/tcp", socket.AF_INET), (f"/proc/{pid}/net/tcp6", socket.AF_INET6)):
        for line in open(f).readlines()[1:]:
            x = line.split()
            if x[3] != "0A" or x[9] not in inodes:
                continue
            h, port = x[1].split(":")
            raw = b"".join(struct.pack("<I", int(h[i:i + 8], 16)) for i in range(0, len(h), 8))
            a = ipaddress.ip_address(socket.inet_ntop(fam, raw))
            a = getattr(a, "ipv4_mapped", None) or a
            print(f"pid {pid} listens on {a}:{int(port, 16)}")
            bad += not a.is_loopback
sys.exit(bad > 0)
PY
sed 's/^/  /' "$TMP/listen.txt"
ray job logs --address "$ADDRESS" "$id" >"$TMP/job-now.log" 2>&1
coord=$(grep -oE "start [0-9]+: .*coordinator [^ ,;]+" "$TMP/job-now.log" | tail -1 | awk '{print $NF}')
[ -n "$coord" ] || fail "no coordinator in the job's log"
probe() { "$CLUSTER" exec env SLICETRAIN_TOKEN_FILE="$ST_RAY_DIR/slicetrain_token" "$PY" "$ST_ROOT/tests/ray/handshake_probe.py" "$@"; }
nprobed=0
for p in $(sed -nE 's/.* listens on ([0-9.]+:[0-9]+)$/\1/p' "$TMP/listen.txt"); do
	if [ "$p" = "$coord" ]; then # the rendezvous store: also the right token, answered
		probe "$p" notoken wrong right | sed 's/^/  store /' || fail "the store $p: a probe did not get what it must"
	else
		probe "$p" notoken wrong | sed 's/^/  transport /' || fail "the transport $p: a probe was not refused"
	fi
	nprobed=$((nprobed + 1))
done
[ "$nprobed" -gt 0 ] || fail "no listening port of slicetrain to probe"
n0=$(wc -l <"$DATA/$run.jsonl")
sleep 2
[ "$(wc -l <"$DATA/$run.jsonl")" -gt "$n0" ] || fail "the run stopped training after the probes"

echo "== 4. kill -9 of node 2's raylet: shrink to 1 slice"
raylet2=$("$CLUSTER" pids 2)
node2_st=""
for p in $(st_pids); do # slicetrain <- its Ray worker <- the raylet that started that
	w=$(awk '{print $4}' "/proc/$p/stat")
	[ "$(awk '{print $4}' "/proc/$w/stat" 2>/dev/null)" = "$raylet2" ] && node2_st="$node2_st $p"
done
[ -n "$node2_st" ] || fail "no slicetrain process of node 2 (raylet $raylet2) found"
step_at_kill=$(last_step "$DATA/$run.jsonl")
kill_out=$("$CLUSTER" kill-node 2)
echo "  $kill_out (after step $step_at_kill)"
t_kill=$(echo "$kill_out" | grep -oE "at [0-9.]+" | cut -c4-)
gone() { for p in $node2_st; do [ -e "/proc/$p" ] && [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" != Z ] && return 1; done; return 0; }
if wait_for 10 "node 2's slicetrain process ($node2_st) to end" gone; then
	echo "  node 2's slicetrain process (pid$node2_st) ended $(awk -v a="$t_kill" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}') s after the kill at most: no orphan"
fi
n_kill=$(wc -l <"$DATA/$run.jsonl")
shrunk() { ray job logs --address "$ADDRESS" "$id" 2>/dev/null | grep -q -- "-> 1 slice(s)" && [ "$(wc -l <"$DATA/$run.jsonl")" -ge $((n_kill + 3)) ]; }
wait_for 240 "training on 1 slice" shrunk
ray list nodes --address "$ADDRESS" --format json 2>/dev/null | "$PY" -c '
import json, sys
for x in sorted(json.load(sys.stdin), key=lambda x: x["is_head_node"], reverse=True):
    print("  node %s... head=%s %s %s" % (x["node_id"][:12], x["is_head_node"], x["state"], x.get("state_message") or ""))'
ray list nodes --address "$ADDRESS" --format json 2>/dev/null | "$PY" -c 'import json,sys; sys.exit(not any(x["state"] == "DEAD" for x in json.load(sys.stdin)))' ||
	fail "ray list nodes: node 2 is not DEAD"
echo "  training on 1 slice: step $(last_step "$DATA/$run.jsonl")"

echo "== 5. node 2 back: grow to 2 slices"
add_out=$("$CLUSTER" add-node 2)
echo "  $add_out"
t_add=$(echo "$add_out" | grep -oE "started at [0-9.]+" | cut -c12-)
grown() { ray job logs --address "$ADDRESS" "$id" 2>/dev/null | grep -- "slicetrain ray: start" | tail -1 | grep -q -- "-> 2 slice(s)"; }
wait_for 240 "the group to grow back to 2 slices" grown

echo "== 6. the end"
t0=$SECONDS
while kill -0 $submit 2>/dev/null && [ $((SECONDS - t0)) -lt 400 ]; do sleep 1; done
kill -0 $submit 2>/dev/null && { fail "ray job submit still waiting after 400 s"; kill $submit; }
wait $submit
rc=$?
st=$(job_status "$id")
grep -E "Job '.*' (succeeded|failed)" "$TMP/submit.out" | sed 's/^.*-- /  ray job submit: /; s/\x1b\[[0-9;]*m//g'
echo "  ray job submit exit $rc; ray job status: $st"
[ "$rc" = 0 ] && [ "$st" = SUCCEEDED ] || fail "the job did not succeed (exit $rc, $st)"
ray job logs --address "$ADDRESS" "$id" >"$TMP/job.log" 2>&1
sed 's/\x1b\[[0-9;]*m//g' "$TMP/job.log" | grep -E "slicetrain ray: |Deciding to (resize|start/restart)|FailurePolicy\] (RETRY|RAISE)|startup timed out|restored step|stopping after step|\"event\": \"ray_" |
	sed -E 's/^\(([A-Za-z]+) pid=[0-9]+(, ip=[0-9.]+)?\) /(\1) /; s/(timed out after [0-9.]+ seconds waiting for [0-9]+ workers).*/\1/' | cut -c1-200 | uniq | sed 's/^/  /'
# why each restart that Ray charged to a failure happened (its first error line)
sed 's/\x1b\[[0-9;]*m//g' "$TMP/job.log" | awk '/FailurePolicy\] RETRY/ {n = 1; next}
	n && /([A-Za-z]+Error: |The actor died|timed out after)/ && !/Error count|Training failed due to/ {
		sub(/^\([A-Za-z]+ pid=[0-9]+(, ip=[0-9.]+)?\) */, ""); print "  restart reason: " substr($0, 1, 160); n = 0 }' |
	uniq | tee "$TMP/reasons.txt"
# the kill's restarts only: a peer's failure, the lost worker, a start at the stale size
bad=$(grep -vE "RuntimeError: slicetrain rank [0-9]+ exited with status|The actor died|timed out after" "$TMP/reasons.txt")
[ -z "$bad" ] || fail "a restart not caused by the kill: $bad"
left=$(st_pids)
[ -z "$left" ] || fail "slicetrain processes left after the job: $left"

"$PY" - "$DATA/$run.jsonl" "$TMP/job.log" $steps "$t_kill" "$t_add" <<'PY' || fail "the kept history or the restarts are not as they must be"
import json, re, sys
path, log, steps, t_kill, t_add = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
recs = [r for r in map(json.loads, open(path)) if "step" in r]
count = {}
for r in recs:
    count[r["step"]] = count.get(r["step"], 0) + 1
kept = sorted(count)
again = sum(c - 1 for c in count.values())
print(f"  metrics: {len(recs)} step records, kept history steps {kept[0]}..{kept[-1]} ({len(kept)} distinct); "
      f"{again} step(s) trained twice (rolled back by a restart)")
ok = kept == list(range(steps))
starts, summary = [], None
for line in open(log):
    m = re.search(r'(\{"event": "ray_(start|summary)".*\})', line)
    if m:
        r = json.loads(m.group(1))
        (starts.append(r) if r["event"] == "ray_start" else None)
        summary = r if r["event"] == "ray_summary" else summary
if summary is None:
    print("  no summary in the job's log"); sys.exit(1)
sizes = [s["slices"] for s in starts if s["first_step"] is not None]
print(f"  starts that trained: slices {sizes}; retrained per restart {summary['retrained']}")
shrink = next((i for i, s in enumerate(starts) if s["slices"] == 1 and s["first_step"] is not None), None)
grow = next((i for i, s in enumerate(starts) if shrink is not None and i > shrink and s["slices"] == 2
             and s["first_step"] is not None), None)
if shrink is None or grow is None:
    print("  want a start on 1 slice (shrink) and a later one on 2 slices (grow)"); sys.exit(1)
tl = summary["timeline"]
rec_shrink = tl[shrink][1] - t_kill
rec_grow = tl[grow][1] - t_add
print(f"  shrink: kill -9 of node 2's raylet -> first step on 1 slice: {rec_shrink:.1f} s "
      f"(resumed at step {starts[shrink]['first_step']}, {starts[shrink]['retrained']} step(s) trained again); "
      f"with Ray's defaults: 70.5 s here, 66 s in the Ray reference (docs/ray.md)")
print(f"  grow:   node 2 back -> first step on 2 slices: {rec_grow:.1f} s "
      f"(resumed at step {starts[grow]['first_step']}, {starts[grow]['retrained']} step(s) trained again); "
      f"with Ray's defaults: 58.5 s here; the reference: 22 s to the resize decision")
if again != sum(summary["retrained"]):
    print(f"  steps trained twice in the metrics ({again}) != the trainer's count ({sum(summary['retrained'])})"); ok = False
sys.exit(not ok)
PY

echo "== the fault-free reference: slicetrain launch, 2 slices, the same $steps steps"
ref_keys=("${keys[@]}")
ref_keys[0]=$TMP/work/base.yml
OMP_NUM_THREADS=1 "$SLICETRAIN" launch --num-slices 2 --devices-per-slice 1 -- "${ref_keys[@]}" run_name=ref \
	base_output_directory="$TMP/ref/" metrics_file="$TMP/ref.jsonl" >"$TMP/ref.out" 2>&1 ||
	fail "the reference run failed: $(tail -3 "$TMP/ref.out")"
for r in ray:"$DATA/$run" ref:"$TMP/ref/ref"; do
	"$SLICETRAIN" export "${r#*:}/checkpoints/$steps" "$TMP/hf-${r%%:*}" >/dev/null 2>"$TMP/export.err" ||
		fail "export of ${r%%:*} failed: $(tail -1 "$TMP/export.err")"
done
"$PY" - "$TMP/hf-ref/model.safetensors" "$TMP/hf-ray/model.safetensors" <<'PY' || fail "the final weights differ from the fault-free run's by more than 1e-4"
import json, struct, sys
import numpy as np
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    return {k: np.frombuffer(b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], np.float32).astype(np.float64)
            for k, v in h.items() if k != "__metadata__"}
a, b = load(sys.argv[1]), load(sys.argv[2])
rel = {k: np.linalg.norm(a[k] - b[k]) / np.linalg.norm(a[k]) for k in a}
k = max(rel, key=rel.get)
same = open(sys.argv[1], "rb").read() == open(sys.argv[2], "rb").read()
print(f"  final weights vs the fault-free run: worst tensor |w - w_ref| / |w_ref| {rel[k]:.2e} ({k}), "
      f"{len(a)} tensors; {'bit-identical' if same else 'not bit-identical'}")
sys.exit(not (a.keys() == b.keys() and rel[k] <= 1e-4))
PY

echo "== 8. tokens"
tok=$(cat "$ST_RAY_DIR/slicetrain_token")
ray job list --address "$ADDRESS" >"$TMP/joblist.txt" 2>&1
curl_json() { "$PY" -c 'import json,os,sys,urllib.request
r = urllib.request.Request(sys.argv[1], headers={"Authorization": "Bearer " + open(os.environ["RAY_AUTH_TOKEN_PATH"]).read().strip()})
print(urllib.request.urlopen(r, timeout=10).read().decode())' "$1"; }
curl_json "$ADDRESS/api/jobs/" >"$TMP/jobs.json" 2>&1 || fail "GET /api/jobs/ with the Ray token failed: $(tail -1 "$TMP/jobs.json")"
for f in job.log submit.out joblist.txt jobs.json; do
	grep -qF "$tok" "$TMP/$f" && fail "the run token is in $f"
done
grep -qF "$(cat "$RAY_AUTH_TOKEN_PATH")" "$TMP/job.log" && fail "the Ray token is in the job's log"
echo "  the run token is in no job log, entrypoint or runtime_env (ray job logs, ray job list, /api/jobs/)"
refused() { # NAME COMMAND...: must fail, with an authentication error
	"$@" >"$TMP/refused.out" 2>&1 && { fail "$1... was not refused"; return; }
	grep -qiE "auth|unauthori[sz]ed|401|403|token" "$TMP/refused.out" ||
		{ fail "refused without naming authentication: $(tail -2 "$TMP/refused.out")"; return; }
	echo "  refused: $(grep -iE "auth|unauthori[sz]ed|401|403|token" "$TMP/refused.out" | tail -1 | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-150)"
}
echo "  a wrong Ray token:"
refused env RAY_AUTH_TOKEN="wrong-$RANDOM$RANDOM$RANDOM$RANDOM" ray job list --address "$ADDRESS"
echo "  no Ray token:"
mkdir -p "$TMP/home"
refused env -u RAY_AUTH_TOKEN_PATH HOME="$TMP/home" ray job list --address "$ADDRESS"
echo "  a bare HTTP request:"
refused "$PY" -c 'import sys,urllib.request; urllib.request.urlopen(sys.argv[1] + "/api/jobs/", timeout=10)' "$ADDRESS"
echo "  ray job submit with a wrong Ray token:"
refused env RAY_AUTH_TOKEN="wrong-$RANDOM$RANDOM$RANDOM$RANDOM" ray job submit --address "$ADDRESS" --no-wait -- echo hi
[ "$(ray job list --address "$ADDRESS" 2>/dev/null | grep -o "submission_id=" | wc -l)" = 1 ] ||
	fail "a job was added by a refused submission"
finish
