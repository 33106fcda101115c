#!/usr/bin/env bash
# A real Slurm cluster of NODES nodes (default 2) on this one host, for CI and for trying the scripts in
# this folder: Debian's slurmctld, slurmd, slurm-client and munge, no systemd (docs/deploy-testing.md).
#
#   deploy/slurm/local-cluster.sh start DIR     # prints `export SLURM_CONF=DIR/slurm.conf`
#   deploy/slurm/local-cluster.sh stop DIR
#
# Nodes node1..nodeN all run here (multiple-slurmd build), one CPU each, in partition `debug`. DIR holds
# slurm.conf, state, spool and logs. Needs root (munged runs as the munge user, slurmd as root).
set -euo pipefail
usage() { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
action=$1
dir=$(realpath -m "$2")
nodes=${NODES:-2}
port=${SLURMCTLD_PORT:-16817}
conf="$dir/slurm.conf"
# munged runs as the munge user, which may not reach DIR (pytest's temp folders are 0700): its socket,
# pid and log live in a folder of their own, named after DIR.
mdir=/tmp/gpuval-munge-$(printf %s "$dir" | md5sum | cut -c1-12)

stop() {
  if [ -f "$conf" ]; then
    for pidfile in "$dir"/slurmd-*.pid "$dir"/slurmctld.pid; do
      [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
    done
  fi
  [ -f "$mdir/munged.pid" ] && kill "$(cat "$mdir/munged.pid")" 2>/dev/null || true
  sleep 1
  rm -f "$dir"/*.pid
  rm -rf "$mdir"
}

case $action in
stop) stop; exit 0 ;;
start) ;;
*) usage ;;
esac

for tool in munged slurmctld slurmd sinfo; do
  command -v "$tool" >/dev/null || PATH=$PATH:/usr/sbin
  command -v "$tool" >/dev/null || { echo "$0: $tool is missing: apt-get install slurmctld slurmd slurm-client munge" >&2; exit 2; }
done
stop
mkdir -p "$dir"/state "$dir"/spool "$dir"/log "$mdir"
# munge: a socket of its own, so a second cluster or a system munged do not collide
chown munge:munge "$mdir"
chmod 755 "$mdir"
[ -s /etc/munge/munge.key ] || { mungekey --create --force; chown munge:munge /etc/munge/munge.key; }
runuser -u munge -- munged --socket="$mdir/munge.socket" --pid-file="$mdir/munged.pid" \
  --log-file="$mdir/munged.log" --seed-file="$mdir/munged.seed" --force

cat > "$conf" <<CONF
ClusterName=gpuval-local
SlurmctldHost=localhost
SlurmctldPort=$port
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$mdir/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
# sbatch --wait polls after 2, 10 and 42 s (x4 each time) unless a third of MinJobAge is smaller: with 15 s
# it polls every 5 s, so the seconds-long test jobs are not waited on for half a minute, and a finished
# job's record outlives about three polls (at 6 s a poll delayed on a loaded 2-core host found the record
# purged: "sbatch: error: Job 2 no longer found and exit code not found").
MinJobAge=15
NodeName=node[1-$nodes] NodeHostname=localhost Port=[$((port + 1))-$((port + nodes))] CPUs=1 RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=node[1-$nodes] Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF

export SLURM_CONF="$conf"
slurmctld -f "$conf"
# A slurmd that starts before slurmctld listens registers late (its retry is minutes away on some builds):
# start the nodes once the controller answers.
for _ in $(seq 1 60); do
  scontrol ping 2>/dev/null | grep -q UP && break
  sleep 0.5
done
start_node() { slurmd -f "$conf" -N "$1"; }
for i in $(seq 1 "$nodes"); do
  start_node "node$i"
done
# Ready when every node is idle. A node still not idle after 15 s has its slurmd restarted once (on a
# busy 2-core host a first registration can be lost); the whole wait is bounded at 90 s.
restarted=0
for step in $(seq 1 180); do
  idle=$(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)
  [ "$idle" -ge "$nodes" ] && { echo "export SLURM_CONF=$conf"; exit 0; }
  if [ "$step" -eq 30 ] && [ "$restarted" -eq 0 ]; then
    restarted=1
    for i in $(seq 1 "$nodes"); do
      node="node$i"
      sinfo -h -N -t idle -o %N 2>/dev/null | grep -qx "$node" && continue
      pidfile="$dir/slurmd-$node.pid"
      [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
      sleep 1
      start_node "$node"
      scontrol update NodeName="$node" State=RESUME 2>/dev/null || true
    done
  fi
  sleep 0.5
done
echo "$0: the nodes did not come up; see $dir/log/" >&2
sinfo -N >&2 || true
tail -n 5 "$dir"/log/slurmd-*.log >&2 2>/dev/null || true
exit 1
