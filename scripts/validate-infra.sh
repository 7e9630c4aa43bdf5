#!/usr/bin/env bash
# Offline checks of infra/ (Helm chart, Dockerfile, KServe runtime, dashboard, alert rules):
# renders the chart without a cluster, validates every manifest against the Kubernetes schemas
# of supported versions, scans with checkov and hadolint, lints YAML, and checks that every
# metric the dashboard and the alerts query is one a live control plane, worker or
# `tessera serve` exports (scripts/validate_infra.py says what each stage does).
#
#   scripts/validate-infra.sh [--only lint,render,kubernetes,flags,checkov,hadolint,yamllint,metrics]
#
# The tools come from their own venv (scripts/setup-infra-tools.sh, PyPI only). The metrics
# and flags stages need the built binary: $TESSERA_BIN, default $CARGO_TARGET_DIR/debug/tessera,
# and `cc` for the fake NVML; ORT_DYLIB_PATH or scripts/setup-ort.sh's library for the models.
# Rendered manifests are left in $TESSERA_CACHE/infra-rendered for a look.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

venv="$("$TESSERA_ROOT/scripts/setup-infra-tools.sh" | tail -n1)" || die "scripts/setup-infra-tools.sh failed"
export TESSERA_BIN="${TESSERA_BIN:-$CARGO_TARGET_DIR/debug/tessera}"
[[ -x "$TESSERA_BIN" ]] || die "no tessera binary at $TESSERA_BIN (cargo build --bin tessera, or set TESSERA_BIN)"
if [[ -z "${ORT_DYLIB_PATH:-}" ]]; then
  ORT_DYLIB_PATH="$("$TESSERA_ROOT/scripts/setup-ort.sh" | tail -n1)" || die "scripts/setup-ort.sh failed"
  export ORT_DYLIB_PATH
fi
exec "$venv/bin/python" "$TESSERA_ROOT/scripts/validate_infra.py" --out "$TESSERA_CACHE/infra-rendered" "$@"
