#!/usr/bin/env bash
# `make demo`: starts the dev SMTP sink, central-outbox (SQLite under var/demo, with its web
# console) and a site-forwarder, sends notifications through the site's CLI, shows each reaching
# Delivered and the mail the sink received, then stops everything with SIGTERM.
# `make demo-up` (DEMO_KEEP=1) does the same but keeps the services up to look around (the
# console, outboxctl, grpcurl) until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=target/debug
var=var/demo
site_addr=http://127.0.0.1:50062
rm -rf "$var" && mkdir -p "$var"

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

"$bin/smtp-sink" --listen 127.0.0.1:2526 >"$var/smtp-sink.log" 2>&1 & pids+=($!)
"$bin/central-outbox" --config deploy/demo/central.toml 2>"$var/central.log" & pids+=($!)
"$bin/site-forwarder" serve --config deploy/demo/site.toml 2>"$var/site.log" & pids+=($!)

# Wait (bounded) until the site answers.
for _ in $(seq 1 100); do
  "$bin/site-forwarder" stats --addr "$site_addr" >/dev/null 2>&1 && break
  sleep 0.1
done

echo "== sending notifications through the site-forwarder"
ids=()
for subject in "Tank 4 high level" "Batch 117 complete" "Pump P-3 tripped"; do
  id=$("$bin/site-forwarder" send --addr "$site_addr" --list operators \
        --subject "$subject" --body "$subject (sent by make demo at $(date -u +%H:%M:%S))")
  echo "  $id  $subject"
  ids+=("$id")
done

echo "== waiting for delivery"
for id in "${ids[@]}"; do
  for _ in $(seq 1 100); do
    status=$("$bin/site-forwarder" status --addr "$site_addr" "$id" 2>&1 | head -n1 || true)
    case "$status" in Delivered*) break ;; esac
    sleep 0.1
  done
  echo "  $id  $status"
  case "$status" in Delivered*) ;; *) echo "demo failed: $id is not delivered" >&2; exit 1 ;; esac
done

echo "== mail received by the SMTP sink"
cat "$var/smtp-sink.log"

if [ "${DEMO_KEEP:-0}" = 1 ]; then
  echo "== look around"
else
  echo "== look around with \`make demo-up\`: this run stops the services now, so these addresses"
  echo "   stop answering; \`make demo-up\` runs the same demo and keeps them up until Ctrl-C"
fi
echo "  console:  http://127.0.0.1:50065/  (open: the demo runs with [auth] mode = \"none\")"
echo "  outboxctl: $bin/outboxctl --addr http://127.0.0.1:50061 kpis"
echo "             $bin/outboxctl --addr http://127.0.0.1:50061 list --status delivered"
echo "             $bin/outboxctl --addr http://127.0.0.1:50061 sites"
if [ "${DEMO_KEEP:-0}" = 1 ]; then
  echo "== services stay up until Ctrl-C (logs in $var/)"
  trap 'echo; echo "== stopping (SIGTERM)"; cleanup; exit 0' INT TERM
  wait
fi
echo "== stopping (SIGTERM)"
