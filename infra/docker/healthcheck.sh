#!/usr/bin/env bash
# Docker HEALTHCHECK of the tessera images, with no curl in them: one HTTP/1.0 GET over
# bash's /dev/tcp, healthy on a 200. What it reads:
#   TESSERA_HEALTHCHECK_URL  http://HOST:PORT/PATH, if set;
#   else the control plane (TESSERA_LISTEN given): GET /healthz on that port;
#   else worker, serve and gateway: GET /v2/health/live on TESSERA_HTTP_PORT (8000).
# Kubernetes uses its own probes (the Helm chart) and never runs this.
set -euo pipefail

url="${TESSERA_HEALTHCHECK_URL:-}"
if [[ -z "$url" ]]; then
  if [[ -n "${TESSERA_LISTEN:-}" ]]; then
    url="http://127.0.0.1:${TESSERA_LISTEN##*:}/healthz"
  else
    url="http://127.0.0.1:${TESSERA_HTTP_PORT:-8000}/v2/health/live"
  fi
fi
rest="${url#http://}"
hostport="${rest%%/*}"
path="/${rest#*/}"
[[ "$rest" == */* ]] || path="/"
host="${hostport%:*}"
port="${hostport##*:}"
[[ "$host" != "$hostport" ]] || port=80

exec 3<>"/dev/tcp/$host/$port"
printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$path" "$hostport" >&3
read -r -t 3 _ status _ <&3
[[ "$status" == 200 ]]
