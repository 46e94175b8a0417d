# The elastic soak's short version (bench/elastic_soak.sh, `make soak` runs
# 100 faults): one run of 2 slices x 1 device, one fault of each kind from
# outside by pid (SIGKILL of a worker, of an agent; SIGTERM to a worker, to an
# agent; a kill while a checkpoint save is in flight; a kill of a new
# generation before its first step), each recovered within 60 s; the
# launcher exits 0; every committed checkpoint verifies; at most
# max_num_checkpoints_to_keep (3) + 1 committed at once; the kept history's
# steps and samples; the final weights within 1e-4 of a fault-free run's; no
# process left behind. About 60 s, most of it sleeping (the steps are
# paced).
# On the sanitized build only when the suite has one (make check): its
# workers are the optimized build's there too, so the run on the optimized
# build would repeat the same training with an unsanitized launcher,
# controller and agents (which the other elastic tests run there).
# timeout: 240
# load: light
# builds: sanitized
. "$(dirname "$0")/../cli_lib.sh"
need_python numpy
. "$(dirname "$0")/elastic_lib.sh" # on a sanitized build: optimized workers when there are (SLICETRAIN_WORKER_EXE)
# the elastic tests' small batch, paced (elastic_lib.sh: el_floor)
env BATCH=$el_batch SEQ=$el_seq MIN_STEP_S=$el_floor FAULTS=kinds SLICETRAIN="$SLICETRAIN" TMPDIR="$TMP" "$ST_ROOT/bench/elastic_soak.sh" >"$TMP/soak.log" 2>&1
rc=$?
grep -v '^    slicetrain controller' "$TMP/soak.log" | sed 's/^/  /'
[ $rc = 0 ] || fail "bench/elastic_soak.sh FAULTS=kinds: exit $rc"
finish
