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

# Each step prints the disk in use: CI's disk is small (a run failed with "No space left on
# device" while linking the test binaries), and this shows what each step costs.
step() {
  printf '\n==> %s (%s; disk used %s, free %s)\n' "$*" "$(date -u +%H:%M:%S)" \
    "$(df -h --output=used . | tail -n 1 | tr -d ' ')" "$(df -h --output=avail . | tail -n 1 | tr -d ' ')"
}
started=$(date +%s)
# Every crate is built once per run: incremental compilation would only add its own copy of
# each crate's objects (gigabytes over the ~60 test binaries). A developer's setting wins.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}

step "system packages"
bash scripts/install-system-packages.sh

step "third-party binaries (deps/build.sh; cached in ${TNO_DEPS_DIR:-$HOME/.cache/tailnet-operator/deps})"
# gateway-api-conformance (not in `all`, ~6 min cold): the suite's CI subset runs below.
# Go's build cache grows to ~11 GB building them cold and is of no use once the binaries are
# cached: unless GOCACHE is set, the builds get a cache of their own, removed afterwards (a
# recipe change then recompiles that component from scratch instead of in seconds).
own_gocache=""
if [ -z "${GOCACHE:-}" ]; then
  own_gocache=$(mktemp -d -t tno-deps-gocache.XXXXXX)
  export GOCACHE=$own_gocache
fi
bash deps/build.sh all gateway-api-conformance
if [ -n "$own_gocache" ]; then
  rm -rf "$own_gocache"
  unset GOCACHE
fi

step "static checks: rustfmt, clippy"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings

step "dependencies: cargo deny (advisories offline against ../shared/advisory-db, licenses, bans, sources)"
command -v cargo-deny >/dev/null || cargo install cargo-deny --locked
# The RustSec database is a plain snapshot (CI's checkout has shared/ beside the project;
# TNO_ADVISORY_DB points elsewhere). cargo-deny wants a git clone in a folder named after its
# URL: copy it into a temporary one, committed with the snapshot's date (cargo-deny takes
# HEAD's time as the fetch time and fails when it is older than maximum-db-staleness).
advisory_src=${TNO_ADVISORY_DB:-../shared/advisory-db}
if [ ! -d "$advisory_src/crates" ]; then
  echo "RustSec advisory database not found at $advisory_src (set TNO_ADVISORY_DB)" >&2
  exit 1
fi
advisory_root=$(mktemp -d -t tno-advisory-dbs.XXXXXX)
advisory_db="$advisory_root/advisory-db-3157b0e258782691"
cp -R "$advisory_src" "$advisory_db"
chmod -R u+w "$advisory_db"
snapshot_date=$(sed -n 's/.* of \([0-9]\{4\}-[0-9]\{2\}-[0-9]\{2\}\).*/\1/p' "$advisory_db/SNAPSHOT.md" 2>/dev/null | head -n 1)
if [ -z "$snapshot_date" ]; then
  echo "no snapshot date in $advisory_src/SNAPSHOT.md: taking the files' modification time" >&2
  snapshot_date=$(date -u -r "$advisory_src/crates" +%Y-%m-%d)
fi
git -C "$advisory_db" init -q -b main
git -C "$advisory_db" add -A
GIT_COMMITTER_DATE="${snapshot_date}T00:00:00Z" git -C "$advisory_db" -c user.name=tno -c user.email=tno@localhost \
  -c commit.gpgsign=false commit -q --no-verify --date "${snapshot_date}T00:00:00Z" -m "RustSec snapshot of $snapshot_date"
# --offline also keeps cargo-deny's `cargo metadata` from the network: it reads every
# platform's crates (windows-sys, ...), which a Linux build never downloads. Fetch them all
# first (a fresh machine has only what its builds needed).
cargo fetch --locked
deny_status=0
TNO_ADVISORY_DB_ROOT="$advisory_root" cargo deny --offline check advisories licenses bans sources || deny_status=$?
rm -rf "$advisory_root"
(( deny_status == 0 )) || exit "$deny_status"

step "fuzzing: 20 s per cargo-fuzz target (scripts/fuzz.sh --long for long runs)"
# First the script's own verdict: with a stand-in cargo whose `fuzz run` fails like libFuzzer
# on a crash (exit 77, no artifact written), scripts/fuzz.sh must fail.
fuzz_stub=$(mktemp -d -t tno-fuzz-stub.XXXXXX)
cat >"$fuzz_stub/cargo" <<'STUB'
#!/usr/bin/env bash
case "$*" in
  *"fuzz run"*) echo "==1== ERROR: libFuzzer: deadly signal"; exit 77 ;;
  *) exit 0 ;;
esac
STUB
cp "$fuzz_stub/cargo" "$fuzz_stub/cargo-fuzz"
chmod +x "$fuzz_stub/cargo" "$fuzz_stub/cargo-fuzz"
if PATH="$fuzz_stub:$PATH" bash scripts/fuzz.sh --seconds 1 >"$fuzz_stub/out" 2>&1; then
  cat "$fuzz_stub/out"
  echo "scripts/fuzz.sh passed although libFuzzer exited non-zero" >&2
  exit 1
fi
rm -rf "$fuzz_stub"
bash scripts/fuzz.sh
# The fuzz builds (instrumented, one per target) are not used again in this run: keep the
# corpus and the logs, free the rest.
find target/fuzz -mindepth 1 -maxdepth 1 ! -name corpus ! -name '*.log' -exec rm -rf {} +

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
# target/images to the lab's registry and installs the chart from there; quick_start (side
# group) runs docs/quick-start.md's `cargo xtask images --push … --chart`, which then only
# assembles and pushes (the release binaries are built here).
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
# The side group is this list of test binaries (targets under */tests/); the test functions the
# main group skips are derived from it: each side binary lists its tests (`--list`: nothing
# runs, the binaries were built above), and the main group skips exactly those names
# (`--exact`). Adding a binary here is the only edit; a name that is not unique across all
# test binaries would also be skipped elsewhere, so that is checked first.
side_tests=(gateway_e2e faults_e2e ingress_data_e2e egress_routes_e2e helm_rbac_e2e local_lab forged_agent_e2e leadership_e2e
  helm_install network_policy_e2e egress_devices_e2e contributors_e2e service_lb_e2e split_horizon_e2e quick_start
  two_headscales_e2e prometheus_e2e)
side_targets=()
for t in "${side_tests[@]}"; do side_targets+=(--test "$t"); done
list_tests() { cargo test --workspace --locked "$@" -- --list --format terse 2>/dev/null | sed -n 's/: test$//p'; }
mapfile -t side_names < <(list_tests "${side_targets[@]}")
if (( ${#side_names[@]} < ${#side_tests[@]} )); then
  echo "side group: ${#side_names[@]} tests listed for ${#side_tests[@]} binaries (${side_tests[*]})" >&2
  exit 1
fi
all_names=$(list_tests --tests)
for n in "${side_names[@]}"; do
  if (( $(grep -cxF -- "$n" <<<"$all_names") != 1 )); then
    echo "side-group test $n is not unique across the test binaries (a test in a shared module, or a name used twice): --skip would drop the others too" >&2
    exit 1
  fi
done
side_log=$(mktemp -t tno-side-tests.XXXXXX)
cargo test --workspace --locked --no-fail-fast "${side_targets[@]}" >"$side_log" 2>&1 &
side_pid=$!
skips=()
for n in "${side_names[@]}"; do skips+=(--skip "$n"); done
main_status=0
cargo test --workspace --locked --no-fail-fast -- --exact "${skips[@]}" || main_status=$?
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
