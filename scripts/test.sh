#!/usr/bin/env bash
# Runs every check and test of the project, as CI does (.ci/run calls this script).
# On a fresh machine it installs what it needs: Debian packages, the Go-built third-party
# binaries (kube-apiserver, etcd, headscale, tailscaled, ... cached outside the work tree,
# see deps/README.md), then checks formatting, lints, generated files and runs all tests —
# unit tests and the tests against the real apiserver, Headscale and tailscale nodes
# (those need root for network namespaces).
set -euo pipefail
cd "$(dirname "$0")/.."
# rustup installs cargo here; a non-login shell may not have it on PATH.
command -v cargo >/dev/null || export PATH="$HOME/.cargo/bin:$PATH"

step() { printf '\n==> %s (%s)\n' "$*" "$(date -u +%H:%M:%S)"; }
started=$(date +%s)

step "system packages"
bash scripts/install-system-packages.sh

step "third-party binaries (deps/build.sh; cached in ${TNO_DEPS_DIR:-$HOME/.cache/tailnet-operator/deps})"
bash deps/build.sh all

step "static checks: rustfmt, clippy"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings

step "dependencies: cargo deny (licenses, bans, sources; advisories need GitHub, see deny.toml)"
command -v cargo-deny >/dev/null || cargo install cargo-deny --locked
cargo deny check licenses bans sources

step "fuzzing: 20 s per cargo-fuzz target (scripts/fuzz.sh --long for long runs)"
bash scripts/fuzz.sh

step "Helm chart and monitoring rules (helm lint, promtool check/test rules)"
DEPS_ENV=$(bash deps/build.sh --print-env)
HELM=$(sed -n 's/^TNO_BIN_HELM=//p' <<<"$DEPS_ENV")
PROMTOOL=$(sed -n 's/^TNO_BIN_PROMTOOL=//p' <<<"$DEPS_ENV")
"$HELM" lint --strict charts/tailnet-operator
"$PROMTOOL" check rules charts/tailnet-operator/files/prometheus-rules.yaml
"$PROMTOOL" test rules charts/tailnet-operator/tests/prometheus-rules.test.yaml
# helm template + server-side dry-run + RBAC table: crates/testenv/e2e/tests/helm_chart.rs

step "release workflow lint (actionlint)"
ACTIONLINT=$(sed -n 's/^TNO_BIN_ACTIONLINT=//p' <<<"$DEPS_ENV")
"$ACTIONLINT" .github/workflows/*.yaml

step "build binaries (the test kubelet runs the freshly built tailnet-agent)"
cargo build --workspace --bins --locked

step "images: cargo xtask images (daemonless, static musl release binaries; assembled twice, digests compared)"
# The same command the release workflow runs; helm_install (side group) pushes the layouts of
# target/images to the lab's registry and installs the chart from there.
rustup target list --installed | grep -qx x86_64-unknown-linux-musl || rustup target add x86_64-unknown-linux-musl
cargo xtask images --verify-reproducible

step "tests: unit, CLI, generated files, real apiserver/Headscale/tailscale"
# The real-environment tests must not skip themselves when binaries are missing.
export TNO_REQUIRE_REAL_ENV=1
cargo test --workspace --locked --no-run
# The end-to-end tests spend most of their time waiting (pods starting, tailscaled logging in,
# probes, timeouts), so one group of them runs beside all the others: about half the wall time
# on two cores. Each test binary starts its own environment (own netns, ports, Headscale), so
# the two groups do not share anything. Same feature set as the build above (--workspace).
side_tests=(faults_e2e ingress_data_e2e egress_routes_e2e helm_rbac_e2e local_lab helm_install)
side_names=(faults_keep_the_data_plane_and_lose_nothing ingress_data_plane_through_the_operator
  unapproved_route_fails_closed_until_approved operator_with_the_charts_rbac_serves_egress_and_ingress
  the_local_lab_demo_runs_once
  chart_installed_from_the_lab_registry_serves_egress_and_ingress_then_upgrades_and_uninstalls)
side_log=$(mktemp -t tno-side-tests.XXXXXX)
side_targets=()
for t in "${side_tests[@]}"; do side_targets+=(--test "$t"); done
cargo test --workspace --locked --no-fail-fast "${side_targets[@]}" >"$side_log" 2>&1 &
side_pid=$!
skips=()
for n in "${side_names[@]}"; do skips+=(--skip "$n"); done
main_status=0
cargo test --workspace --locked --no-fail-fast -- "${skips[@]}" || main_status=$?
side_status=0
wait "$side_pid" || side_status=$?
printf '\n==> side group (%s) output:\n' "${side_tests[*]}"
cat "$side_log"
rm -f "$side_log"
if (( main_status != 0 || side_status != 0 )); then
  printf '\ntests failed (main group exit %s, side group exit %s)\n' "$main_status" "$side_status" >&2
  exit 1
fi

step "done in $(( $(date +%s) - started ))s"
