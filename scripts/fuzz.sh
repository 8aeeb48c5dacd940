#!/usr/bin/env bash
# cargo-fuzz targets of fuzz/ (HuJSON policy, hostname templates, agent config, HTTP front,
# a contributor's fragment).
#   scripts/fuzz.sh                 short run: 20 s per target (CI)
#   scripts/fuzz.sh --long [secs]   long run: 1 h per target by default, all cores
#   scripts/fuzz.sh --seconds N     N seconds per target
# Needs the nightly toolchain (`cargo +nightly`) and cargo-fuzz (installed when missing).
# Seeds (fuzz/seeds) and past findings (fuzz/regressions) are replayed first; the growing
# corpus lives in target/fuzz/corpus (not committed). A crash fails the script and leaves
# the input in fuzz/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo >/dev/null || export PATH="$HOME/.cargo/bin:$PATH"

seconds=20
jobs=1
release=0
case "${1:-}" in
  --long) seconds="${2:-3600}"; jobs=$(nproc); release=1 ;;
  --seconds) seconds="${2:?--seconds needs a number}" ;;
  "") ;;
  *) echo "usage: $0 [--long [seconds] | --seconds N]" >&2; exit 2 ;;
esac

if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz: the nightly toolchain is missing (rustup toolchain install nightly)" >&2
  exit 1
fi
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked

# No sanitizer: the targets are safe Rust, and panics (what they look for) need none. Long
# runs: release with debug assertions (more executions per second). Short runs (CI): a dev
# build, which compiles in about half the time on a cold machine and still replays every seed
# and regression and fuzzes for a while. Shares the workspace target directory.
if [ "$release" = 1 ]; then
  flags=(-O -a --sanitizer none --target-dir ../target/fuzz)
else
  flags=(--dev --sanitizer none --target-dir ../target/fuzz)
fi
targets=(policy_base templates agent_config http_front fragment)
cd fuzz
cargo +nightly fuzz build "${flags[@]}"
for target in "${targets[@]}"; do
  corpus="../target/fuzz/corpus/$target"
  mkdir -p "$corpus"
  inputs=("$corpus")
  for dir in "seeds/$target" "regressions/$target"; do
    [ -d "$dir" ] && inputs+=("$dir")
  done
  echo "==> fuzz $target for ${seconds}s"
  parallel=()
  [ "$jobs" -gt 1 ] && parallel=(-jobs="$jobs" -workers="$jobs")
  # The whole output goes to a log; the summary lines are shown. libFuzzer's exit status is
  # the verdict (non-zero on a crash, an OOM, a timeout, or when it cannot run at all, e.g.
  # a seed directory it cannot read); new artifacts fail the run as well.
  log="../target/fuzz/$target.log"
  mkdir -p ../target/fuzz
  status=0
  cargo +nightly fuzz run "${flags[@]}" "$target" "${inputs[@]}" -- \
    -max_total_time="$seconds" "${parallel[@]}" -print_final_stats=1 -max_len=65536 \
    >"$log" 2>&1 || status=$?
  grep -E '^(#[0-9]+ +DONE|Done|stat::number_of_executed_units|thread|SUMMARY)|panicked' "$log" || true
  if [ "$status" -ne 0 ]; then
    echo "fuzz: $target: cargo fuzz run exited with status $status; last lines of $log:" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
  if compgen -G "artifacts/$target/crash-*" >/dev/null || compgen -G "artifacts/$target/oom-*" >/dev/null \
     || compgen -G "artifacts/$target/timeout-*" >/dev/null; then
    echo "fuzz: $target found a failing input:" artifacts/"$target"/* >&2
    exit 1
  fi
done
