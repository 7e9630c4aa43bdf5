#!/usr/bin/env bash
# Starts a GPU or MIG worker only if NVML, as this pod sees it, shows exactly the devices
# Kubernetes granted the pod. The device plugin decides what the container sees
# (NVIDIA_VISIBLE_DEVICES): whole GPUs for nvidia.com/gpu, MIG instances for
# nvidia.com/mig-<profile> with the `mixed` strategy; the worker offers what NVML shows, so a
# mismatch means a misconfigured node (MIG layout changed under the plugin, strategy `single`,
# a GPU visible to every container) and must not register wrong slices.
#
#   check-inventory.sh gpu=2 -- tessera worker ...
#   check-inventory.sh mig-1g.18gb=4 mig-3g.71gb=1 -- tessera worker ...
#
# `tessera gpus` (TESSERA_BIN, default `tessera`) reports the slices a worker would offer.
set -euo pipefail

declare -A want=()
while (($#)) && [[ "$1" != "--" ]]; do
  want["${1%%=*}"]="${1#*=}"
  shift
done
[[ "${1:-}" == "--" ]] || { echo "usage: $0 PROFILE=COUNT... -- COMMAND..." >&2; exit 2; }
shift

report="$("${TESSERA_BIN:-tessera}" gpus)" || { echo "inventory check: tessera gpus failed" >&2; exit 1; }
# Slices show as `"profile": "gpu"` or `"profile": "mig-<profile>"`; MIG devices under "gpus"
# show their profile without the "mig-" prefix, so they do not count twice.
declare -A seen=()
while read -r profile; do
  seen["$profile"]=$(( ${seen["$profile"]:-0} + 1 ))
done < <(grep -oE '"profile": "(gpu|mig-[^"]+)"' <<<"$report" | sed -E 's/.*: "(.*)"/\1/')

ok=1
for profile in "${!want[@]}"; do
  if [[ "${seen[$profile]:-0}" != "${want[$profile]}" ]]; then
    echo "inventory check: Kubernetes granted ${want[$profile]} x $profile, NVML shows ${seen[$profile]:-0}" >&2
    ok=0
  fi
done
for profile in "${!seen[@]}"; do
  if [[ -z "${want[$profile]:-}" ]]; then
    echo "inventory check: NVML shows ${seen[$profile]} x $profile that Kubernetes did not grant" >&2
    ok=0
  fi
done
if ((ok == 0)); then
  echo "inventory check: refusing to start a worker whose slices differ from its grant" >&2
  exit 1
fi
echo "inventory check: NVML agrees with the grant (${!want[*]})" >&2
exec "$@"
