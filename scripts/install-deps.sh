#!/usr/bin/env bash
# Installs what slicetrain needs on Debian (bookworm), as root; installs only
# what is missing and runs `apt-get update` only when something is.
#   scripts/install-deps.sh          build dependencies
#   scripts/install-deps.sh --test   plus what the test suite needs
set -euo pipefail
pkgs=(gcc make libc6-dev libdnnl-dev libyaml-dev libjansson-dev)
if [ "${1:-}" = "--test" ]; then
	pkgs+=(python3 python3-numpy python3-torch)
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
