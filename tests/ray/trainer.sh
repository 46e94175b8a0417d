# deploy/ray/slicetrain_elastic_trainer.py's pure parts, without a cluster
# (tests/ray/test_trainer.py): the group plan of a (re)start (whole slices,
# rounding down, slice order, host order, the coordinator), the environment of
# a slicetrain process (Ray's token and other launchers' variables removed),
# the run token's file checks, the step line, and the driver's refusals of
# bad input (exit 2 with the reason, before Ray is touched).
# timeout: 300
. "$(dirname "$0")/lib.sh"
"$PY" "$ST_ROOT/tests/ray/test_trainer.py" 2>&1 | sed 's/^/  /'
[ "${PIPESTATUS[0]}" = 0 ] || fail "tests/ray/test_trainer.py"
finish
