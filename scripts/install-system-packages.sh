#!/usr/bin/env bash
# Debian packages the tests need; installs only what is missing (idempotent, quiet when done).
set -euo pipefail
packages=(iproute2 nftables conntrack iptables curl ca-certificates openssl
  # benchmarks and their CI smoke (crates/bench): the baselines and the HTTP load generator
  socat nginx-light wrk
  # cargo xtask images: ring for the static x86_64-unknown-linux-musl release binaries
  musl-tools
  # kube-router, the lab's NetworkPolicy enforcer
  ipset)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "all present: ${packages[*]}"
fi
