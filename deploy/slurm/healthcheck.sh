#!/usr/bin/env bash
# Slurm node health check with gpuval: use as HealthCheckProgram (slurm.conf) or as a Prolog.
#
#   HealthCheckProgram=/opt/gpuval/deploy/slurm/healthcheck.sh   HealthCheckInterval=300
#   Prolog=/opt/gpuval/deploy/slurm/healthcheck.sh               (runs before every job on each node)
#
# Runs `gpuval health` on this node. FAIL (exit 1): drains the node with
# `scontrol update NodeName=<node> State=DRAIN Reason="gpuval: <check> ..."` and exits 1 (a Prolog that
# fails keeps the job off the node; HealthCheckProgram's exit code is ignored, hence the explicit drain).
# PASS: exit 0, and a node this script drained earlier (Reason begins "gpuval:") is resumed; a node
# drained for any other reason stays drained. ERROR or a usage error (exit 3 or 2: the checker itself is broken, e.g. a bad profile or no
# Python): the node is left alone and the script exits 0 — a broken checker must not drain a good node.
# A profile is required (GPUVAL_PROFILE, or --profile in GPUVAL_HEALTH_ARGS): without one the node is drained
# with Reason="gpuval: health check has no profile configured" and the script exits 1, before gpuval runs.
# It fails closed because a picked profile judges a node by what it shows: a node whose driver is dead
# shows no GPU, and only the profile says it must have eight.
# Settings: GPUVAL_PROFILE (a built-in name such as h100-sxm, or a YAML file), GPUVAL_PYTHON (default
# python3), GPUVAL_HEALTH_ARGS (more arguments, e.g. "--set expect.gpu_count=4"), GPUVAL_HEALTH_LOG (a
# folder to keep health's result.json and output in; default: a temporary one).
# slurmd starts HealthCheckProgram and Prolog with almost no environment (PATH=/bin:/usr/bin, where
# python3 has no gpuval): put the settings in /etc/gpuval/healthcheck.conf (KEY=VALUE lines, e.g.
# GPUVAL_PYTHON=/opt/gpuval/.venv/bin/python) on every node; GPUVAL_HEALTHCHECK_CONF names another file.
# Variables already set in the environment win over the file.
set -uo pipefail
conf=${GPUVAL_HEALTHCHECK_CONF:-/etc/gpuval/healthcheck.conf}
if [ -r "$conf" ]; then
  while IFS='=' read -r key value; do
    case $key in
    GPUVAL_PROFILE | GPUVAL_PYTHON | GPUVAL_HEALTH_ARGS | GPUVAL_HEALTH_LOG)
      [ -z "${!key:-}" ] && export "$key=$value" ;;
    '' | \#*) ;;
    *) echo "gpuval healthcheck: $conf: unknown setting '$key' ignored" >&2 ;;
    esac
  done <"$conf"
fi
node=${SLURMD_NODENAME:-$(hostname -s)}
python=${GPUVAL_PYTHON:-python3}
profile=()
[ -n "${GPUVAL_PROFILE:-}" ] && profile=(--profile "$GPUVAL_PROFILE")
if [ ${#profile[@]} -eq 0 ] && [[ " ${GPUVAL_HEALTH_ARGS:-} " != *" --profile"[=\ ]* ]]; then
  scontrol update NodeName="$node" State=DRAIN Reason="gpuval: health check has no profile configured"
  echo "gpuval healthcheck: $node drained: no profile configured; set GPUVAL_PROFILE in $conf" >&2
  exit 1
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/gpuval-health.XXXXXX")
trap 'rm -rf "$work"' EXIT
keep=${GPUVAL_HEALTH_LOG:-}
# shellcheck disable=SC2086  # GPUVAL_HEALTH_ARGS is a list of arguments
"$python" -m gpuval health ${profile[@]+"${profile[@]}"} ${GPUVAL_HEALTH_ARGS:-} --output "$work/health" >"$work/output.txt" 2>&1
rc=$?
# Exit 1 without a result (python3 without gpuval: "No module named gpuval") is a broken checker, not FAIL.
[ "$rc" -eq 1 ] && [ ! -s "$work/health/result.json" ] && rc=3
[ -n "$keep" ] && mkdir -p "$keep" && cp -r "$work"/. "$keep"/ 2>/dev/null
case $rc in
0)
  # Healthy again: a node this script drained (its Reason begins "gpuval:") is resumed, as NHC resumes
  # what NHC drained. A node drained by anyone else (maintenance, another checker) is left drained.
  state=$(scontrol show node "$node" 2>/dev/null)
  if [[ "$state" == *State=*DRAIN* && "$state" == *"Reason=gpuval:"* ]]; then
    reason=$(sed -n 's/.*Reason=\(gpuval:[^[]*\).*/\1/p' <<<"$state" | head -n 1)
    scontrol update NodeName="$node" State=RESUME
    echo "gpuval healthcheck: $node resumed: health passes (it was drained for '${reason% }')" >&2
  fi
  exit 0
  ;;
1)
  # The failed checks, as "name (scope)", joined: the reason `sinfo -R` shows (Slurm keeps it short).
  reason=$("$python" - "$work/health/result.json" <<'PY'
import json, sys
checks = json.load(open(sys.argv[1], encoding="utf-8"))["checks"]
failed = [f"{c['name']} ({c['scope']})" for c in checks if c["status"] == "FAIL"]
print(", ".join(failed)[:200] or "health FAIL")
PY
  ) || reason="health FAIL"
  scontrol update NodeName="$node" State=DRAIN Reason="gpuval: $reason"
  echo "gpuval healthcheck: $node drained: $reason" >&2
  exit 1
  ;;
*)
  echo "gpuval healthcheck: gpuval health could not check $node (exit $rc); node left as it is:" >&2
  tail -n 3 "$work/output.txt" >&2
  exit 0
  ;;
esac
