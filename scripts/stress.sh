#!/usr/bin/env bash
# Runs the fault and cluster tests (the in-process cluster and the
# operated one, internal/testsupport/opcluster), the parallel-step and child-run crash
# tests among them (and the rolling deploys, reruns and bulk reruns), N times (default 5) with the race
# detector while a CPU hog keeps every core busy, and prints how many
# rounds passed. `make stress` runs it; JETFLOW_STRESS_RUNS changes N.
set -uo pipefail
cd "$(dirname "$0")/.."

runs=${JETFLOW_STRESS_RUNS:-5}
root='^(TestFault|TestParallelThousandBranches|TestDrain|TestWorkerKilled|TestCluster|TestZombie|TestStop|TestSaturated|TestWorkerWithAnotherAckWait|TestLoweringAckWait|TestLongBackoff|TestRetryTimer|TestSweeper|TestLegacyRunsTakenOver|TestBulkRerun|TestRerun|TestRollingDeploy)'
testenv='^TestClusterStopRestartKeepsStreams$'
opcluster='^(TestOperatedCluster|TestUpgrade)'

hog=$(mktemp)
go build -o "$hog" ./internal/testsupport/testenv/cpuhog || exit 1
"$hog" -for 3h &
hogpid=$!
trap 'kill $hogpid 2>/dev/null; rm -f "$hog"' EXIT

passed=0
for i in $(seq 1 "$runs"); do
  log=$(mktemp)
  if go test -race -count=1 -timeout 30m -run "$root" . >"$log" 2>&1 &&
     go test -race -count=1 -timeout 10m -run "$testenv" ./internal/testsupport/testenv/ >>"$log" 2>&1 &&
     go test -race -count=1 -timeout 10m -run "$opcluster" ./internal/testsupport/opcluster/ >>"$log" 2>&1; then
    passed=$((passed + 1))
    echo "stress round $i: pass"
  else
    echo "stress round $i: FAIL"
    grep -E '^(--- FAIL|FAIL|panic:)|Error:|Messages:|Error Trace:' "$log" | head -40
  fi
  rm -f "$log"
done
echo "stress: $passed of $runs rounds passed under a CPU hog"
[ "$passed" -eq "$runs" ]
