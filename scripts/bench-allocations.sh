#!/usr/bin/env bash
# Allocation calls per request of the agent's HTTPS ingress (docs/benchmarks.md, "Known
# misses"): the agent with one `http` listener (TLS, one route) in a network namespace of its
# own, under heaptrack, loaded by wrk (keep-alive GET /1k), then heaptrack_print's total over
# wrk's request count. Needs root, heaptrack (apt-get install heaptrack), wrk and openssl.
#
#   scripts/bench-allocations.sh AGENT [SECONDS [CONNECTIONS [OUTDIR]]]
#
# AGENT: a glibc build (heaptrack preloads itself; the static musl image binary cannot be
# profiled) with the system allocator (heaptrack sees malloc only, not the agent's default
# mimalloc), e.g. `cargo build --profile profiling -p tno-bench && cargo build --profile
# profiling -p tailnet-agent --no-default-features` and target/profiling/tailnet-agent. The
# backend is `tno-bench serve-http` ($TNO_BENCH, default target/profiling/tno-bench). The
# agent's own idle allocations (≈ 120/s: its status polls) are counted too: < 0.3 % at 16
# connections for 10 s.
set -euo pipefail
cd "$(dirname "$0")/.."
agent=$(realpath "$1"); seconds=${2:-10}; connections=${3:-16}
out=$(realpath -m "${4:-target/bench/allocations}")
bench=$(realpath "${TNO_BENCH:-target/profiling/tno-bench}")
. scripts/bench-common.sh
bench_require heaptrack heaptrack_print:heaptrack wrk openssl
rm -rf "$out"; mkdir -p "$out"; cd "$out"
bench_listener_files "$out" agent:8443:9180
ns=tno-allocations-$$
bench_namespace "$ns"
export agent seconds connections bench ns
ip netns exec "$ns" unshare --mount --propagation private bash -c '
set -euo pipefail
mount --bind hosts /etc/hosts
"$bench" serve-http --port 18080 --localapi-socket "$PWD/localapi.sock" >backend.log 2>&1 &
backend=$!
RUST_LOG=warn heaptrack -o "$PWD/agent" "$agent" --config agent.json --pod-ip 10.250.0.2 >agent.log 2>&1 &
profiler=$!
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/8443) 2>/dev/null && break; sleep 0.1; done
sleep 1
wrk --latency -t 2 -c "$connections" -d "${seconds}s" https://bench.test:8443/1k >wrk.txt
# Stop the agent itself (heaptrack writes its data when the program exits): the process of
# that binary in this namespace only.
for pid in $(pgrep -x "$(basename "$agent" | cut -c1-15)"); do
  [ "$(ip netns identify "$pid")" = "$ns" ] && kill -TERM "$pid"
done
wait "$profiler" || true
kill "$backend" || true
'
heaptrack_print -f agent*.zst >summary.txt 2>&1
calls=$(sed -n 's/^calls to allocation functions: \([0-9]*\).*/\1/p' summary.txt)
requests=$(sed -n 's/^ *\([0-9]*\) requests in.*/\1/p' wrk.txt)
echo "allocation calls: $calls; requests: $requests; per request: $(awk -v c="$calls" -v r="$requests" 'BEGIN { printf "%.1f", c / r }')"
echo "(heaptrack data: $out/agent*.zst; heaptrack_print -a for the sites)"
