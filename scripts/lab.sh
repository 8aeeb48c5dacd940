#!/usr/bin/env bash
# The local lab: installs and builds what is missing (Debian packages, the Go-built programs the
# lab runs — kube-apiserver/etcd/headscale/tailscaled/CoreDNS/helm/crane/kube-router —, the
# Rust binaries and the product's images), then starts a real control plane, test kubelet,
# kube-proxy, CoreDNS, Headscale and a remote site behind a subnet router in network
# namespaces, and installs the product the way users do: the images (`xtask images` over a
# `cargo build --profile lab`, daemon-less) and the chart pushed to the lab's OCI registry, `helm install`
# from there — the operator runs as a pod from its image, its agents from theirs. Then the demo:
# CoreDNS wired as docs/dns.md says, NetworkPolicies enforced (kube-router), examples/ applied
# (Tailnet in Apply mode, TailnetEgress, TailnetIngress with its backends), one egress
# connection (a pod's bytes → remote-db → tailnet → 192.0.2.10:5432), one HTTPS ingress request
# (the laptop node → https://portal.team-a.lab.example.net via MagicDNS), the same name from
# inside the cluster (a listed namespace answered, an unlisted one refused), the egress alias
# with its SNI, `kubectl get` of the resources, and the lockdown guard: a base without rules
# (allow-all) is refused in Apply while the live policy stays, then the demo's base comes back.
# Each phase prints its time ("[lab] <phase>: N s").
#
# Needs root. Ctrl-C stops it and cleans up. `--once` stops after the demo (exit code = result);
# `--bare` starts only the environment; `--dev` runs the lab build's tailnet-operator as a local
# process instead of the chart's pod; `--second-cluster` also starts a
# second cluster on the same Headscale and, with the demo, runs examples/second-cluster/ there
# (a contributor, its operator a process).
set -euo pipefail
cd "$(dirname "$0")/.."
# rustup installs cargo here; a non-login shell may not have it on PATH.
command -v cargo >/dev/null || export PATH="$HOME/.cargo/bin:$PATH"

# Cargo's output directory (CARGO_TARGET_DIR is honoured, relative to the repository root).
target_dir=${CARGO_TARGET_DIR:-target}
phase_started=$(date +%s)
phase() {
  local now
  now=$(date +%s)
  echo "[lab] $1: $((now - phase_started)) s" >&2
  phase_started=$now
}
# `timed NAME COMMAND…`: runs COMMAND, prints its time and exits with its status.
timed() {
  local name=$1 started status=0
  shift
  started=$(date +%s)
  "$@" || status=$?
  echo "[lab]   $name: $(($(date +%s) - started)) s (exit $status)" >&2
  return "$status"
}

bash scripts/install-system-packages.sh
phase "system packages"
musl_target="$(uname -m)-unknown-linux-musl"
rustup target list --installed | grep -qx "$musl_target" || rustup target add "$musl_target"
# Only what the lab runs is built here; scripts/test.sh builds the test-only tools (caddy,
# prometheus, actionlint).
# tailscale-minimal is the agents' tailscaled (the tailnet-tailscaled image); the full tailscale
# build runs the lab's laptop and subnet router.
lab_components=(kubernetes etcd headscale tailscale tailscale-minimal coredns cert-manager cert-manager-controller helm crane kube-router)
# One cargo build, one profile (`lab`: unoptimised, no debug info, not incremental) and one
# target: the images' static binaries (the operator and the agent; releases use --profile
# release), the lab's own runner and test servers (the runner finds them next to itself) and
# xtask, which assembles the images from those binaries once the Go programs are built (the
# tailnet-tailscaled image is deps' minimal tailscaled). xtask is built for the musl target
# too so its dependencies (k8s-openapi, kube's derive) are compiled once, not again for the host.
lab_binaries="$target_dir/lab-binaries"
build_rust() {
  cargo build --locked --profile lab --target "$musl_target" \
    -p tailnet-operator --bin tailnet-operator -p tailnet-agent --bin tailnet-agent \
    -p tno-testenv --bin tno-lab -p tno-testenv-kube --bin tno-test-servers -p xtask --bin xtask &&
    mkdir -p "$lab_binaries" &&
    ln -sfn "$(cd "$target_dir/$musl_target/lab" && pwd)" "$lab_binaries/$musl_target"
}
assemble_images() {
  "$target_dir/$musl_target/lab/xtask" images --out "$target_dir/lab-images" --binaries "$lab_binaries"
}
# The Go modules download while cargo compiles; then the Go programs compile, two at a time
# (deps/build.sh, TNO_DEPS_JOBS), with the cores to themselves. Measured cold on 2 cores: builds
# 1147 s this way (cargo 207 s with the downloads beside it, Go 940 s) against 1171-1182 s when
# both compiled side by side.
echo "[lab] building the Rust binaries and the third-party programs (first run: ~20 min)…" >&2
deps_cache=${TNO_DEPS_DIR:-$HOME/.cache/tailnet-operator/deps}
timed "Go modules (deps/build.sh --download; beside cargo)" \
  bash deps/build.sh --download "${lab_components[@]}" &
downloads=$!
rust_status=0 go_status=0
timed "Rust binaries (cargo build --profile lab)" build_rust || rust_status=$?
wait "$downloads" || go_status=$?
if ((rust_status == 0 && go_status == 0)); then
  timed "third-party programs (deps/build.sh; cached in $deps_cache)" \
    bash deps/build.sh "${lab_components[@]}" || go_status=$?
fi
if ((rust_status == 0 && go_status == 0)); then
  timed "images (xtask images)" assemble_images || rust_status=$?
fi
if ((rust_status != 0 || go_status != 0)); then
  echo "[lab] a build failed (Rust: exit $rust_status, Go programs: exit $go_status); see above" >&2
  exit 1
fi
phase "builds"
exec "$target_dir/$musl_target/lab/tno-lab" --images "$target_dir/lab-images" "$@"
