#!/usr/bin/env bash
# crash-demo.sh: one charge per order, across SIGKILLed workers, with the
# shipped binaries.
#
# It starts NATS (nats-server with JetStream), the example payment service as
# a process of its own with its ledger in a file (examples/orders/payments),
# the HTTP API (producer serve) and a worker charging through the payment
# service (cmd/worker --payments-url). Then it starts CRASH_DEMO_ORDERS
# orders over HTTP, each one twice with the same Idempotency-Key, as a
# webhook delivered twice, retrying every 503 (no worker while one is down)
# with that key. While the orders are charged it SIGKILLs the worker twice,
# once a third and once two thirds of the orders are charged, and restarts
# it. Each kill lands while charges are made but not yet answered (the
# payment service holds its answers from the third, or two thirds, of the
# charges on until the worker is dead), the worst moment: the
# worker's steps are redelivered and charge again with the same key, and the
# payment service answers with the charges it made. When every run has ended
# it prints, for instance,
#
#   3000 orders, 3000 charges, 0 duplicates
#
# and exits 0; it exits 1 when the numbers disagree, a run did not complete
# or a start was not answered 201.
#
# Environment (all optional):
#   CRASH_DEMO_ORDERS         how many orders (default 3000)
#   CRASH_DEMO_BIN            a directory with the binaries worker, producer,
#                             payments and nats-server; empty: they are built
#                             with go build into a temporary directory
#   CRASH_DEMO_NATS_PORT      NATS port on 127.0.0.1 (default 4390)
#   CRASH_DEMO_PAYMENTS_PORT  payment service port (default 4391)
#   CRASH_DEMO_API_PORT       HTTP API port (default 4392)
#   CRASH_DEMO_ACK_WAIT       the worker's --ack-wait (default 2s): how soon a
#                             killed worker's steps are redelivered
#   CRASH_DEMO_TIMEOUT        seconds each phase may take (default 300)
#   CRASH_DEMO_KEEP           1 keeps the work directory (logs, ledger)
set -euo pipefail

orders=${CRASH_DEMO_ORDERS:-3000}
bin=${CRASH_DEMO_BIN:-}
nats_url=nats://127.0.0.1:${CRASH_DEMO_NATS_PORT:-4390}
pay_url=http://127.0.0.1:${CRASH_DEMO_PAYMENTS_PORT:-4391}
api_url=http://127.0.0.1:${CRASH_DEMO_API_PORT:-4392}
ack_wait=${CRASH_DEMO_ACK_WAIT:-2s}
timeout=${CRASH_DEMO_TIMEOUT:-300}
root=$(cd "$(dirname "$0")/../.." && pwd)

work=$(mktemp -d "${TMPDIR:-/tmp}/crash-demo.XXXXXX")
pids=()
cleanup() {
	local pid
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
	wait 2>/dev/null || true
	if [ "${CRASH_DEMO_KEEP:-}" = 1 ]; then echo "logs and ledger kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

fail() {
	local log
	echo "crash-demo: $*" >&2
	for log in "$work"/*.log; do
		echo "--- the last lines of $log" >&2
		tail -n 3 "$log" >&2
	done
	echo "crash-demo: logs: $work (kept)" >&2
	CRASH_DEMO_KEEP=1
	exit 1
}

# wait_for DESCRIPTION COMMAND...: run COMMAND every 0.1s until it succeeds;
# fail after CRASH_DEMO_TIMEOUT seconds.
wait_for() {
	local what=$1 deadline=$((SECONDS + timeout))
	shift
	until "$@"; do
		[ "$SECONDS" -lt "$deadline" ] || fail "timed out after ${timeout}s waiting for $what"
		sleep 0.1
	done
}

# count FIELD: a number from the payment service's GET /charges/count.
count() {
	curl -sf "$pay_url/charges/count" | sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p"
}
held() { [ "$(count held)" -gt 0 ]; }
alive() { kill -0 "$1" 2>/dev/null || fail "$2 exited; see $work/$2.log"; }

if [ -z "$bin" ]; then
	bin=$work/bin
	echo "building worker, producer, payments and nats-server into $bin"
	(cd "$root" && go build -o "$bin/" ./cmd/worker ./cmd/producer ./examples/orders/payments &&
		go build -o "$bin/nats-server" github.com/nats-io/nats-server/v2)
fi

"$bin/nats-server" -js -sd "$work/nats" -a 127.0.0.1 -p "${nats_url##*:}" >"$work/nats-server.log" 2>&1 &
pids+=($!)
nats_ready() { alive "${pids[0]}" nats-server && grep -qs 'Server is ready' "$work/nats-server.log"; }
wait_for "nats-server" nats_ready

"$bin/payments" --addr "${pay_url#http://}" --ledger "$work/ledger.jsonl" 2>"$work/payments.log" &
pids+=($!)
pay_ready() { alive "${pids[1]}" payments && curl -sf -o /dev/null "$pay_url/charges/count"; }
wait_for "the payment service" pay_ready

"$bin/producer" --nats-url "$nats_url" serve --http-addr "${api_url#http://}" 2>"$work/producer.log" &
pids+=($!)
api_ready() { alive "${pids[2]}" producer && curl -sf -o /dev/null "$api_url/healthz"; }
wait_for "the HTTP API" api_ready

starts=0 # how many times the worker has started
worker=
: >"$work/worker.log"
start_worker() {
	"$bin/worker" --nats-url "$nats_url" --payments-url "$pay_url" --ack-wait "$ack_wait" \
		--ops-addr= --log-format json 2>>"$work/worker.log" &
	worker=$!
	pids+=("$worker")
	starts=$((starts + 1))
	wait_for "the worker to start" worker_started
}
worker_started() {
	alive "$worker" worker && [ "$(grep -c '"message":"worker started"' "$work/worker.log")" -ge "$starts" ]
}
start_worker

# The order workflow requires the caller's run ID: a start asking for a
# generated one, which no retry could repeat, is refused and stores nothing.
input='{"order_id":"o-1","amount_cents":1999,"currency":"usd","email":"ada@example.com"}'
refused=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$api_url/v1/workflows/order/runs?generate_run_id=true" \
	-H 'Content-Type: application/json' -d "$input")
echo "a start asking for a generated run ID: $refused (order requires the caller's run ID)"
[ "$refused" = 400 ] || fail "a start asking for a generated run ID was answered $refused, not 400"

# One curl process starts every order twice, 16 requests at a time,
# retrying a 503 with the same Idempotency-Key. The answers' bodies go to
# the same file as their status lines ("answer 201"): curl cannot truncate
# /dev/null before a retry.
for i in $(seq 1 "$orders"); do
	body="{\"order_id\":\"o-$i\",\"amount_cents\":1999,\"currency\":\"usd\",\"email\":\"ada@example.com\"}"
	quoted=${body//\"/\\\"} # as a curl config string
	for _ in 1 2; do
		printf '%s\n' next "url = \"$api_url/v1/workflows/order/runs\"" \
			'header = "Content-Type: application/json"' "header = \"Idempotency-Key: order-o-$i\"" \
			"data = \"$quoted\"" "retry = 20" "retry-max-time = $timeout" \
			'write-out = "\nanswer %{http_code}\n"'
	done
done | sed 1d >"$work/starts.curl"
echo "starting $orders orders, each twice, while the worker is killed twice"
curl --no-progress-meter --parallel --parallel-max 16 --config "$work/starts.curl" >"$work/answers" 2>"$work/curl.log" &
client=$!

# The answers are held from a third of the charges on; after the first kill,
# before the worker is back, from two thirds on; after the second, no more.
curl -sf -X POST "$pay_url/answers/hold?after=$((orders / 3))"
for k in 1 2; do
	wait_for "charge $((orders * k / 3)) and its answer held" held
	unanswered=$(count held) # at least as many are unanswered at the kill
	kill -KILL "$worker"
	wait "$worker" 2>/dev/null || true
	if [ "$k" = 1 ]; then
		curl -sf -X POST "$pay_url/answers/hold?after=$((orders * 2 / 3))"
	else
		curl -sf -X POST "$pay_url/answers/release"
	fi
	at=$(count charges)
	echo "worker SIGKILLed at $at of $orders charges, $unanswered or more of them not yet answered"
	start_worker
	echo "worker restarted"
done

wait "$client" || fail "curl failed starting the orders: $(tail -3 "$work/curl.log")"
answers=$(sed -n 's/^answer //p' "$work/answers" | sort | uniq -c | awk '{printf "%s%d answered %s", sep, $1, $2; sep=", "}')
echo "$((2 * orders)) starts: $answers"
[ "$(grep -c '^answer 201$' "$work/answers")" -eq $((2 * orders)) ] || fail "not every start was answered 201"

runs() { "$bin/producer" --nats-url "$nats_url" list --workflow order --status "$1" --limit 1; }
none_running() { [ "$(runs running)" = "no runs" ]; }
wait_for "every run to end" none_running
for status in failed cancelled; do
	[ "$(runs "$status")" = "no runs" ] || fail "some runs $status: $(runs "$status")"
done

replays=$(grep -c '"replayed":true' "$work/payments.log" || true)
echo "$replays charge requests were answered with the charge already made (replays)"
charges=$(count charges) charged=$(count orders) duplicates=$(count duplicates)
echo "$orders orders, $charges charges, $duplicates duplicates"
[ "$charges" -eq "$orders" ] && [ "$charged" -eq "$orders" ] && [ "$duplicates" -eq 0 ] ||
	fail "expected $orders charges of $orders orders, no duplicates"
