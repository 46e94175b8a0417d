# deploy/k8s offline (no cluster can be reached from here; docs/ray.md):
#  1. every manifest of deploy/k8s validates: core kinds against Kubernetes
#     1.35's schemas (kubernetes-validate, strict), the RayCluster against
#     our schema of KubeRay v1.6.2's CRD, KubeRay's own checks across fields,
#     its pod templates as core/v1, and slicetrain's token rules
#     (tests/ray/validate_manifests.py);
#  2. every deliberately broken manifest (tests/ray/bad-manifests/*.yaml) is
#     refused, for the reason its "# expect:" line names;
#  3. the Dockerfile: no -march=native; what it COPYs exists and passes its
#     .dockerignore; its Debian packages exist in bookworm (apt-cache); its
#     Ray pin is install-deps.sh's; each of its three builds (the same make
#     command) compiles here, the x86-64-v2 one has no AVX-512 instruction
#     and trains; its dispatch script picks the build this CPU runs fastest.
#  4. docker: whether this machine can build the image (said, not failed).
# timeout: 400
. "$(dirname "$0")/lib.sh"
V="$PY $ST_ROOT/tests/ray/validate_manifests.py"

echo "== 1. deploy/k8s manifests"
$V "$ST_ROOT"/deploy/k8s/*.yaml | sed 's/^/  /'
[ "${PIPESTATUS[0]}" = 0 ] || fail "a manifest of deploy/k8s is invalid"

echo "== 2. broken manifests: each refused, for its reason"
for f in "$ST_ROOT"/tests/ray/bad-manifests/*.yaml; do
	want=$(sed -n 's/^# expect: //p' "$f" | head -1)
	out=$($V --expect-fail "$f")
	rc=$?
	echo "  $(echo "$out" | cut -c1-170)"
	[ $rc = 0 ] || { fail "$(basename "$f"): not refused"; continue; }
	[[ "$out" == *"$want"* ]] || fail "$(basename "$f"): refused, but not for '$want'"
done

echo "== 3. the Dockerfile"
D=$ST_ROOT/deploy/k8s/Dockerfile
grep -v '^ *#' "$D" | grep -q -- "-march=native" && fail "the Dockerfile builds with -march=native"
"$PY" - "$D" "$ST_ROOT" <<'PY' || fail "the Dockerfile's COPY sources, packages or Ray pin"
import fnmatch, os, re, subprocess, sys
dockerfile, root = sys.argv[1], sys.argv[2]
text = open(dockerfile).read().replace("\\\n", " ")
ignore = [l.strip() for l in open(dockerfile + ".dockerignore") if l.strip() and not l.startswith("#")]
def included(path):  # .dockerignore: last matching rule wins; "!" re-includes
    inc = True
    for rule in ignore:
        neg = rule.startswith("!")
        pat = rule[1:] if neg else rule
        if fnmatch.fnmatch(path, pat.rstrip("/")) or path.startswith(pat.rstrip("/") + "/") or pat == "*":
            inc = neg
    return inc
bad = 0
for src in re.findall(r"^COPY (?!--from)(\S+) ", text, re.M):
    p = src.rstrip("/")
    ok = os.path.exists(os.path.join(root, p)) and included(p)
    print(f"  COPY {src}: {'exists, not ignored' if ok else 'MISSING or ignored'}")
    bad += not ok
pkgs = set()
for m in re.findall(r"apt-get install -y --no-install-recommends ([^&]+)&&", text):
    pkgs |= set(m.split())
missing = [p for p in sorted(pkgs) if subprocess.run(["apt-cache", "show", p], capture_output=True).returncode]
print(f"  {len(pkgs)} Debian packages; missing from bookworm's index here: {missing or 'none'}")
bad += bool(missing)
pin = re.search(r'"ray\[default,train\]==([0-9.]+)"', text).group(1)
dep = re.search(r'"ray\[default,train\]==([0-9.]+)"', open(os.path.join(root, "scripts/install-deps.sh")).read()).group(1)
print(f"  Ray {pin} (install-deps.sh --ray: {dep})")
bad += pin != dep
sys.exit(bad > 0)
PY
builds=$(grep -oE 'build [a-z0-9-]+ "[^"]+"' "$D")
echo "$builds" | while read -r _ name march; do
	march=${march//\"/}
	make -s -C "$ST_ROOT" -j2 BUILD="$TMP/build-$name" OPT="-O2 $march -mtune=generic" "$TMP/build-$name/slicetrain" \
		>"$TMP/build-$name.log" 2>&1 || { fail "build $name ($march) failed: $(tail -3 "$TMP/build-$name.log")"; continue; }
	zmm=$(objdump -d "$TMP/build-$name/slicetrain" 2>/dev/null | grep -c zmm)
	echo "  build $name (OPT=\"-O2 $march -mtune=generic\"): ok; $zmm instructions on zmm (AVX-512) registers"
	[ "$name" = x86-64-v2 ] && [ "$zmm" != 0 ] && fail "the portable build uses AVX-512"
done
OMP_NUM_THREADS=1 "$TMP/build-x86-64-v2/slicetrain" train "$ST_ROOT/configs/base.yml" model_name=llama3-test steps=5 \
	per_device_batch_size=2 max_target_length=64 dataset_type=synthetic base_output_directory="$TMP/o" run_name=port \
	enable_checkpointing=false >"$TMP/port.out" 2>&1 || fail "the portable build does not train: $(tail -2 "$TMP/port.out")"
echo "  the x86-64-v2 build trains: $(grep 'completed step: 4,' "$TMP/port.out" | cut -c1-90)"
mkdir -p "$TMP/disp"
for v in x86-64-v2 avx512 avx512bf16; do printf '#!/bin/sh\necho %s\n' "$v" >"$TMP/disp/slicetrain-$v"; chmod +x "$TMP/disp/slicetrain-$v"; done
want=$("$PY" -c '
f = next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split()
v = "x86-64-v2"
if all(x in f for x in ("avx512f", "avx512bw", "avx512dq", "avx512vl")):
    v = "avx512bf16" if "avx512_bf16" in f else "avx512"
print(v)')
got=$(SLICETRAIN_DISPATCH_DIR=$TMP/disp sh "$ST_ROOT/deploy/k8s/slicetrain-dispatch.sh")
forced=$(SLICETRAIN_DISPATCH_DIR=$TMP/disp SLICETRAIN_VARIANT=x86-64-v2 sh "$ST_ROOT/deploy/k8s/slicetrain-dispatch.sh")
echo "  slicetrain-dispatch.sh on this CPU: $got (want $want); SLICETRAIN_VARIANT=x86-64-v2: $forced"
[ "$got" = "$want" ] && [ "$forced" = x86-64-v2 ] || fail "the dispatch script picked the wrong build"

echo "== 4. docker"
if ! command -v docker >/dev/null; then
	echo "  no docker on this machine: the image was not built (the builds above are the Dockerfile's)"
elif ! docker info >/dev/null 2>&1; then
	echo "  docker $(docker version --format '{{.Client.Version}}' 2>/dev/null) is here, but no daemon answers" \
		"($(docker info 2>&1 | grep -m1 -i 'cannot connect' | cut -c1-80)): the image was not built"
else
	docker build -f "$D" -t slicetrain-ray:test "$ST_ROOT" >"$TMP/docker.log" 2>&1 &&
		echo "  docker build: ok ($(docker image inspect slicetrain-ray:test --format '{{.Size}}') bytes)" ||
		echo "  docker build failed here (no registry for debian:bookworm-slim?): $(tail -1 "$TMP/docker.log")"
fi
finish
