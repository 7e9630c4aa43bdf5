#!/usr/bin/env bash
# A local rehearsal of what the Helm chart (infra/helm/tessera) deploys, on one machine:
#
#   Postgres            the registry ($DATABASE_URL's server, else a throwaway PostgreSQL 15)
#   moto_server         S3-compatible object storage (bucket tessera-artifacts, keys under the
#                       prefix cluster/), as objectStore
#   2 control planes    one Deployment's replicas on the same database, store and secrets; one
#                       schedules (Postgres advisory lock), both serve the API; the agent
#                       service on a port of its own (--agent-listen), as in the chart
#   2 Service stand-ins scripts/cluster_proxy.py: connections to the control planes' API and
#                       agent ports, skipping a replica that is gone, as kube-proxy does
#   3 workers           a DaemonSet's pods on three "nodes", each with 2 CPU slices and a
#                       simulated GPU inventory through the fake NVML (tests/fake_nvml):
#                       worker-0 a whole H100, worker-1 an H200 as 1g.18gb x7, worker-2 an H200
#                       as 3g.71gb + 2g.35gb + 1g.18gb x2 (a GPU pool, a MIG pool, a mixed one)
#   a gateway           when the binary has one (`tessera gateway --help` succeeds)
#
#   scripts/cluster.sh up [DIR]      start, print how to reach it, run until Ctrl-C, stop
#   scripts/cluster.sh start DIR     start in the background; DIR/cluster.json describes it
#   scripts/cluster.sh stop DIR      stop what `start` started
#
# Environment: TESSERA_BIN (default $CARGO_TARGET_DIR/debug/tessera); DATABASE_URL, an admin
# URL (a database is created there and dropped by `stop`); MOTO_SERVER (default: the one in
# scripts/setup-python-cp.sh's venv); ORT_DYLIB_PATH (default: scripts/setup-ort.sh's library).
# tests/python_deploy/test_cluster_rehearsal.py drives it: kills the leader and a worker under
# load and checks that serving goes on and the other replica takes the lead.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

say() {
  printf '[cluster] %s\n' "$*" >&2
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# wait_log FILE REGEX SECONDS: waits until FILE has a line matching REGEX.
wait_log() {
  local file="$1" pattern="$2" deadline=$(( $(now_s) + $3 ))
  until grep -qE "$pattern" "$file" 2>/dev/null; do
    if (( $(now_s) > deadline )); then
      say "timed out waiting for /$pattern/ in $file:"
      tail -n 30 "$file" >&2 || true
      return 1
    fi
    sleep 0.1
  done
}

# spawn NAME CMD...: runs CMD in the background with its output in logs/NAME.log, remembers it.
spawn() {
  local name="$1"
  shift
  "$@" >"$DIR/logs/$name.log" 2>&1 &
  printf '%s %s\n' "$!" "$name" >>"$DIR/pids"
}

new_key() {
  python3 -c 'import secrets, string
a = string.ascii_lowercase + string.digits
print("tsk_" + "".join(secrets.choice(a) for _ in range(12)) + "_" + "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(43)))'
}

start_postgres() {
  if [[ -n "${DATABASE_URL:-}" ]]; then
    ADMIN_URL="$DATABASE_URL"
  else
    local pgbin=/usr/lib/postgresql/15/bin port pg
    [[ -x "$pgbin/initdb" ]] || die "no DATABASE_URL and no PostgreSQL 15 in $pgbin"
    port="$(free_port)"
    # Outside DIR: the postgres user must reach it (DIR may be private to root).
    pg="$(mktemp -d /tmp/tessera-cluster-pg.XXXXXX)"
    chown postgres: "$pg"
    runuser -u postgres -- "$pgbin/initdb" -D "$pg/data" --auth=trust -U postgres -E UTF8 --no-sync \
      >"$DIR/logs/initdb.log" 2>&1 || die "initdb failed (see $DIR/logs/initdb.log)"
    runuser -u postgres -- "$pgbin/pg_ctl" -D "$pg/data" -l "$pg/postgres.log" -w -t 30 \
      -o "-c fsync=off -c listen_addresses=127.0.0.1 -p $port -k $pg" start >/dev/null \
      || die "pg_ctl start failed (see $pg/postgres.log)"
    printf '%s\n' "runuser -u postgres -- '$pgbin/pg_ctl' -D '$pg/data' -m immediate stop; rm -rf '$pg'" >"$DIR/pg-stop"
    ADMIN_URL="postgres://postgres@127.0.0.1:$port/postgres"
  fi
  DB_NAME="tessera_cluster_$(python3 -c 'import secrets; print(secrets.token_hex(5))')"
  psql "$ADMIN_URL" -v ON_ERROR_STOP=1 -qc "CREATE DATABASE $DB_NAME" >/dev/null
  DB_URL="${ADMIN_URL%/*}/$DB_NAME"
  printf '%s\n%s\n' "$ADMIN_URL" "$DB_NAME" >"$DIR/db"
}

start_object_store() {
  local moto="${MOTO_SERVER:-}"
  if [[ -z "$moto" ]]; then
    local cp_venv
    cp_venv="$("$TESSERA_ROOT/scripts/setup-python-cp.sh" | tail -n1)" || die "scripts/setup-python-cp.sh failed"
    moto="$cp_venv/bin/moto_server"
  fi
  [[ -x "$moto" ]] || die "moto_server not found at $moto"
  S3_PORT="$(free_port)"
  spawn s3 "$moto" -H 127.0.0.1 -p "$S3_PORT"
  local i
  for i in $(seq 100); do
    curl -sf -X PUT "http://127.0.0.1:$S3_PORT/tessera-artifacts" >/dev/null && return 0
    sleep 0.1
  done
  die "moto_server did not start (see $DIR/logs/s3.log)"
}

start_control_plane() {
  local i="$1" port="$2" agent="$3"
  spawn "control-plane-$i" env RUST_LOG=info NO_COLOR=1 \
    AWS_ENDPOINT="http://127.0.0.1:$S3_PORT" AWS_ALLOW_HTTP=true AWS_REGION=us-east-1 \
    AWS_ACCESS_KEY_ID=tessera AWS_SECRET_ACCESS_KEY=tessera-secret \
    "$TESSERA_BIN" control-plane --listen "127.0.0.1:$port" --agent-listen "127.0.0.1:$agent" \
    --database-url "$DB_URL" --object-store s3://tessera-artifacts/cluster --bootstrap-admin-key "$ADMIN_KEY" \
    --api-key-pepper="$PEPPER" --worker-token="$WORKER_TOKEN" --gateway-token="$GATEWAY_TOKEN" \
    --audit-signing-key-file "$DIR/audit-signing-key.pem" \
    --heartbeat-interval-ms 300 --worker-lost-after-ms 2000 --drain-ms 1000 --scheduler-interval-ms 200
}

# The fake NVML inventories of the three workers ("nodes").
GPU_LAYOUTS=("h100" "h200:1g.18gb*7" "h200:3g.71gb,2g.35gb,1g.18gb*2")

start_worker() {
  local i="$1" http="$2" grpc="$3" metrics="$4"
  spawn "worker-$i" env RUST_LOG=info NO_COLOR=1 FAKE_NVML_GPUS="${GPU_LAYOUTS[$i]}" \
    "$TESSERA_BIN" worker --control-plane "http://127.0.0.1:$AGENT_SERVICE_PORT" \
    --worker-token="$WORKER_TOKEN" --worker-id "worker-$i" --data-dir "$DIR/worker-$i" \
    --http-address 127.0.0.1 --grpc-address 127.0.0.1 --metrics-address 127.0.0.1 \
    --http-port "$http" --grpc-port "$grpc" --metrics-port "$metrics" --advertise-host 127.0.0.1 \
    --cpu-slices 2 --nvml-library "$DIR/nvml/libnvidia-ml.so.1" --key-cache-secs 1
}

cmd_start() {
  DIR="$1"
  TESSERA_BIN="${TESSERA_BIN:-$CARGO_TARGET_DIR/debug/tessera}"
  [[ -x "$TESSERA_BIN" ]] || die "no tessera binary at $TESSERA_BIN (set TESSERA_BIN)"
  if [[ -z "${ORT_DYLIB_PATH:-}" ]]; then
    ORT_DYLIB_PATH="$("$TESSERA_ROOT/scripts/setup-ort.sh" | tail -n1)" || die "scripts/setup-ort.sh failed"
  fi
  export ORT_DYLIB_PATH
  mkdir -p "$DIR/logs" "$DIR/nvml"
  : >"$DIR/pids"
  local start
  start=$(now_s)

  start_postgres
  start_object_store
  cc -shared -fPIC -O1 -o "$DIR/nvml/libnvidia-ml.so.1" "$TESSERA_ROOT/tests/fake_nvml/fake_nvml.c"
  openssl genpkey -algorithm ed25519 -out "$DIR/audit-signing-key.pem" 2>/dev/null
  ADMIN_KEY="$(new_key)"
  PEPPER="$(python3 -c 'import secrets; print(secrets.token_hex(24))')"
  WORKER_TOKEN="$(python3 -c 'import secrets; print(secrets.token_urlsafe(24))')"
  GATEWAY_TOKEN="$(python3 -c 'import secrets; print(secrets.token_urlsafe(24))')"

  # Two control-plane replicas, one after the other so that the first is the leader at first.
  # As the chart runs them: the agent service on a port of its own, behind its own Service.
  local cp_ports=() agent_ports=() i
  for i in 0 1; do
    cp_ports+=("$(free_port)") agent_ports+=("$(free_port)")
    start_control_plane "$i" "${cp_ports[$i]}" "${agent_ports[$i]}"
    wait_log "$DIR/logs/control-plane-$i.log" 'listening' 60
  done
  wait_log "$DIR/logs/control-plane-0.log" 'schedules \(leader\)' 30
  CP_SERVICE_PORT="$(free_port)"
  spawn control-plane-service python3 "$TESSERA_ROOT/scripts/cluster_proxy.py" "$CP_SERVICE_PORT" \
    "127.0.0.1:${cp_ports[0]}" "127.0.0.1:${cp_ports[1]}"
  until curl -sf "http://127.0.0.1:$CP_SERVICE_PORT/healthz" >/dev/null; do sleep 0.1; done
  AGENT_SERVICE_PORT="$(free_port)"
  spawn control-plane-agent-service python3 "$TESSERA_ROOT/scripts/cluster_proxy.py" "$AGENT_SERVICE_PORT" \
    "127.0.0.1:${agent_ports[0]}" "127.0.0.1:${agent_ports[1]}"

  local w_http=() w_grpc=() w_metrics=()
  for i in 0 1 2; do
    w_http+=("$(free_port)") w_grpc+=("$(free_port)") w_metrics+=("$(free_port)")
    start_worker "$i" "${w_http[$i]}" "${w_grpc[$i]}" "${w_metrics[$i]}"
  done
  for i in 0 1 2; do
    wait_log "$DIR/logs/worker-$i.log" 'registered with the control plane' 60
  done

  local gw="" gw_http="" gw_grpc="" gw_metrics=""
  if "$TESSERA_BIN" gateway --help >/dev/null 2>&1; then
    gw_http="$(free_port)" gw_grpc="$(free_port)" gw_metrics="$(free_port)"
    spawn gateway env RUST_LOG=info NO_COLOR=1 "$TESSERA_BIN" gateway \
      --control-plane "http://127.0.0.1:$AGENT_SERVICE_PORT" --gateway-token="$GATEWAY_TOKEN" \
      --gateway-id gateway-0 --http-port "$gw_http" --grpc-port "$gw_grpc" --metrics-port "$gw_metrics"
    wait_log "$DIR/logs/gateway.log" 'listening' 60
    gw="http://127.0.0.1:$gw_http"
  else
    say "this tessera has no gateway role yet: clients go to the workers holding replicas"
  fi

  python3 - "$DIR" <<PY
import json, sys
d = sys.argv[1]
cps = [int(p) for p in "${cp_ports[*]}".split()]
http, grpc, metrics = ([int(p) for p in s.split()] for s in ("${w_http[*]}", "${w_grpc[*]}", "${w_metrics[*]}"))
pids = {}
for line in open(f"{d}/pids"):
    pid, name = line.split()
    pids[name] = int(pid)
layouts = "${GPU_LAYOUTS[*]}".split()
state = {
    "api": "http://127.0.0.1:$CP_SERVICE_PORT",
    "admin_key": "$ADMIN_KEY",
    "worker_token": "$WORKER_TOKEN",
    "gateway_token": "$GATEWAY_TOKEN",
    "database_url": "$DB_URL",
    "agent": "http://127.0.0.1:$AGENT_SERVICE_PORT",
    "s3": {"endpoint": "http://127.0.0.1:$S3_PORT", "bucket": "tessera-artifacts", "prefix": "cluster/"},
    "control_planes": [{"name": f"control-plane-{i}", "url": f"http://127.0.0.1:{p}", "pid": pids[f"control-plane-{i}"],
                        "log": f"{d}/logs/control-plane-{i}.log"} for i, p in enumerate(cps)],
    "workers": [{"id": f"worker-{i}", "http": f"127.0.0.1:{http[i]}", "grpc": f"127.0.0.1:{grpc[i]}",
                 "metrics": f"http://127.0.0.1:{metrics[i]}/metrics", "gpus": layouts[i], "pid": pids[f"worker-{i}"],
                 "log": f"{d}/logs/worker-{i}.log"} for i in range(3)],
    "gateway": {"http": "$gw", "grpc": "127.0.0.1:$gw_grpc", "pid": pids.get("gateway")} if "$gw" else None,
}
json.dump(state, open(f"{d}/cluster.json", "w"), indent=2)
PY
  say "cluster up in $(( $(now_s) - start ))s: API http://127.0.0.1:$CP_SERVICE_PORT (2 control planes), 3 workers${gw:+, gateway $gw}; $DIR/cluster.json"
}

cmd_stop() {
  DIR="$1"
  local pid name
  if [[ -f "$DIR/pids" ]]; then
    # Workers and gateway first (they drain), then the control planes, then storage.
    while read -r pid name; do
      kill -TERM "$pid" 2>/dev/null || true
    done < <(tac "$DIR/pids")
    for _ in $(seq 100); do
      local alive=0
      while read -r pid name; do
        kill -0 "$pid" 2>/dev/null && alive=1
      done <"$DIR/pids"
      ((alive)) || break
      sleep 0.1
    done
    while read -r pid name; do
      kill -KILL "$pid" 2>/dev/null || true
    done <"$DIR/pids"
    rm -f "$DIR/pids"
  fi
  if [[ -f "$DIR/db" ]]; then
    local admin db
    { read -r admin; read -r db; } <"$DIR/db"
    psql "$admin" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
    rm -f "$DIR/db"
  fi
  if [[ -f "$DIR/pg-stop" ]]; then
    bash "$DIR/pg-stop" >/dev/null 2>&1 || true
    rm -f "$DIR/pg-stop"
  fi
}

case "${1:-}" in
  start) [[ -n "${2:-}" ]] || die "usage: $0 start DIR"; cmd_start "$2" ;;
  stop) [[ -n "${2:-}" ]] || die "usage: $0 stop DIR"; cmd_stop "$2" ;;
  up)
    dir="${2:-$(mktemp -d /tmp/tessera-cluster.XXXXXX)}"
    trap 'cmd_stop "$dir"' EXIT
    cmd_start "$dir"
    say "platform-admin key: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["admin_key"])' "$dir/cluster.json")"
    say "logs in $dir/logs; Ctrl-C stops everything"
    while sleep 3600; do :; done
    ;;
  *) die "usage: $0 up [DIR] | start DIR | stop DIR" ;;
esac
