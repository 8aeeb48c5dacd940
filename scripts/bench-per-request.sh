#!/usr/bin/env bash
# CPU, system calls and context switches per request of the agent's HTTPS ingress, side by
# side with a second agent build (optional) and the hand-written floor `tno-bench serve-proxy
# --raw-backend` (docs/benchmarks.md, "Known misses"). All of them serve one `http` listener
# (TLS, one route) in one network namespace, against the same `tno-bench serve-http` backend;
# in every round each is loaded in turn (the first one rotating) by wrk (keep-alive GET /1k) while `perf stat` counts
# its task clock, context switches and system calls, and /proc its user and system time.
# Needs root, perf, wrk and openssl.
#
#   scripts/bench-per-request.sh AGENT [BASELINE_AGENT] [-- CONNECTIONS SECONDS ROUNDS]
#
# e.g. scripts/bench-per-request.sh target/profiling/tailnet-agent /tmp/agent-main -- 128 8 3
# (defaults 128 connections, 8 s, 3 rounds). The backend and the floor are $TNO_BENCH
# (default target/profiling/tno-bench). Output: one line per variant and round, then the
# median of each column per variant; ratios are meaningful only within one run (the machine's
# speed varies between runs).
set -euo pipefail
cd "$(dirname "$0")/.."
agent=$(realpath "$1"); shift
baseline=""
if [ $# -gt 0 ] && [ "$1" != "--" ]; then baseline=$(realpath "$1"); shift; fi
[ "${1:-}" = "--" ] && shift
connections=${1:-128}; seconds=${2:-8}; rounds=${3:-3}
out=$(realpath -m "${TNO_BENCH_OUT:-target/bench/per-request}")
bench=$(realpath "${TNO_BENCH:-target/profiling/tno-bench}")
. scripts/bench-common.sh
bench_require perf:linux-perf wrk openssl
rm -rf "$out"; mkdir -p "$out"; cd "$out"
# Two agents: two listeners and admin ports, one backend.
bench_listener_files "$out" agent:8443:9180 baseline:8445:9181
ns=tno-per-request-$$
bench_namespace "$ns"
export agent baseline connections seconds rounds bench
ip netns exec "$ns" unshare --mount --propagation private bash -c '
set -euo pipefail
mount --bind hosts /etc/hosts
pids=()
"$bench" serve-http --port 18080 --localapi-socket "$PWD/localapi.sock" >backend.log 2>&1 &
pids+=($!)
RUST_LOG=warn "$agent" --config agent.json --pod-ip 10.250.0.2 >agent.log 2>&1 &
pids+=($!); declare -A pid=([agent]=$!) port=([agent]=8443 [floor]=8444 [baseline]=8445)
"$bench" serve-proxy --port 8444 --backend-port 18080 --cert cert.pem --key key.pem \
  --raw-backend >floor.log 2>&1 &
pids+=($!); pid[floor]=$!
variants="agent floor"
if [ -n "$baseline" ]; then
  RUST_LOG=warn "$baseline" --config baseline.json --pod-ip 10.250.0.2 >baseline.log 2>&1 &
  pids+=($!); pid[baseline]=$!
  variants="agent baseline floor"
fi
trap "kill ${pids[*]} 2>/dev/null || true" EXIT
for variant in $variants; do
  for _ in $(seq 100); do
    (exec 3<>/dev/tcp/127.0.0.1/${port[$variant]}) 2>/dev/null && break; sleep 0.1
  done
done
sleep 1
ticks=$(getconf CLK_TCK)
threads=$(( connections < 2 ? connections : 2 ))
read -r -a order <<<"$variants"
for round in $(seq "$rounds"); do
  # Each round starts with the next variant: none is always first or last.
  for index in "${!order[@]}"; do
    variant=${order[$(( (index + round - 1) % ${#order[@]} ))]}
    p=${pid[$variant]}; url=https://bench.test:${port[$variant]}/1k
    wrk -t "$threads" -c "$connections" -d 1s "$url" >/dev/null  # warm-up: connections, pools, caches
    read -r user0 system0 < <(cut -d" " -f14,15 "/proc/$p/stat")
    perf stat -x, -e task-clock,context-switches,raw_syscalls:sys_enter -p "$p" \
      -o "stat-$variant-$round.txt" -- sleep "$seconds" &
    counting=$!
    wrk -t "$threads" -c "$connections" -d "${seconds}s" "$url" >"wrk-$variant-$round.txt"
    wait "$counting"
    read -r user1 system1 < <(cut -d" " -f14,15 "/proc/$p/stat")
    requests=$(sed -n "s/^ *\([0-9]*\) requests in.*/\1/p" "wrk-$variant-$round.txt")
    awk -F, -v variant="$variant" -v round="$round" -v requests="$requests" \
      -v seconds="$seconds" -v ticks="$ticks" -v user=$((user1 - user0)) \
      -v kernel=$((system1 - system0)) "
      /task-clock/ { clock = \$1 } /context-switches/ { switches = \$1 }
      /raw_syscalls/ { calls = \$1 }
      END {
        printf \"%-8s round %d  req/s %7d  cpu_us/req %6.2f  user_us/req %5.2f  sys_us/req %5.2f  syscalls/req %5.2f  switches/req %5.3f\n\",
          variant, round, requests / seconds, clock * 1000 / requests,
          user * 1e6 / ticks / requests, kernel * 1e6 / ticks / requests,
          calls / requests, switches / requests
      }" "stat-$variant-$round.txt"
  done
done | tee rounds.txt
'
rounds_file=$out/rounds.txt
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'; }
echo "median per variant:"
for variant in agent baseline floor; do
  grep -q "^$variant " "$rounds_file" || continue
  line=$(printf '%-8s' "$variant")
  for column in 5 7 9 11 13 15; do
    label=$(awk -v c="$column" 'NR == 1 { print $(c - 1) }' "$rounds_file")
    line+="  $label $(awk -v v="$variant" -v c="$column" '$1 == v { print $c }' "$rounds_file" | median)"
  done
  echo "$line"
done
# Ratios within each round (req/s, CPU per request), then their median.
for other in baseline floor; do
  grep -q "^$other " "$rounds_file" || continue
  for column in 5 7; do
    label=$(awk -v c="$column" 'NR == 1 { print $(c - 1) }' "$rounds_file")
    ratio=$(awk -v o="$other" -v c="$column" '$1 == "agent" { a[$3] = $c } $1 == o { b[$3] = $c }
      END { for (r in a) if (b[r] > 0) printf "%.3f\n", a[r] / b[r] }' "$rounds_file" | median)
    echo "agent / $other $label: $ratio (median of the rounds' ratios)"
  done
done
echo "(raw counts: $out)"
