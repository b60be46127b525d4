#!/usr/bin/env bash
# A real Slurm cluster on this machine, for rtrain's Slurm tests: munged, slurmctld,
# and one slurmd per virtual node (n1..nN, all on 127.0.0.1 with their own ports).
#
#   scripts/slurm_cluster.sh start [NODES]   # default 2 nodes; prints the SLURM_CONF to export
#   scripts/slurm_cluster.sh stop
#   scripts/slurm_cluster.sh status
#
# Everything lives in $RTRAIN_SLURM_DIR (default /tmp/rtrain-slurm): slurm.conf, state,
# logs, pid files. Clients find the cluster through SLURM_CONF=$RTRAIN_SLURM_DIR/slurm.conf.
# Needs root (slurmd runs jobs as their users) and Debian's slurmctld slurmd
# slurm-client munge packages (.ci/run installs them).
set -euo pipefail

DIR=${RTRAIN_SLURM_DIR:-/tmp/rtrain-slurm}
CONF=$DIR/slurm.conf
HOST=$(hostname -s)

nodes_of() { grep -oP '^NodeName=n\[1-\K[0-9]+' "$CONF" 2>/dev/null || echo 2; }

write_conf() {
    local n=$1 cpus
    cpus=$(nproc)
    mkdir -p "$DIR/state" "$DIR/spool"
    cat >"$CONF" <<EOF
ClusterName=rtrain
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=16817
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# Short credentials let a requeued job start again quickly.
AuthInfo=cred_expire=10
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.%n.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
KillWait=5
InactiveLimit=0
MinJobAge=60
RequeueExit=75
NodeName=n[1-$n] NodeHostname=$HOST NodeAddr=127.0.0.1 Port=[17001-$((17000 + n))] CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=n[1-$n] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
}

start() {
    local n=${1:-2}
    stop >/dev/null 2>&1 || true
    write_conf "$n"
    export SLURM_CONF=$CONF
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    if [ ! -s /etc/munge/munge.key ]; then
        dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
        chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
    fi
    if ! pgrep -x munged >/dev/null; then
        runuser -u munge -- /usr/sbin/munged
    fi
    slurmctld -f "$CONF"
    for i in $(seq 1 "$n"); do
        slurmd -f "$CONF" -N "n$i"
    done
    for _ in $(seq 1 60); do
        if [ "$(sinfo -h -o '%T' 2>/dev/null | grep -c idle)" -ge 1 ] &&
            [ "$(sinfo -h -N -o '%N %T' 2>/dev/null | grep -c idle)" -eq "$n" ]; then
            echo "SLURM_CONF=$CONF"
            sinfo -N
            return 0
        fi
        sleep 0.5
    done
    echo "the Slurm cluster did not come up; logs in $DIR" >&2
    sinfo -N >&2 || true
    tail -n 20 "$DIR"/*.log >&2 || true
    return 1
}

stop() {
    export SLURM_CONF=$CONF
    # Only the daemons this script started, by the pids their pid files hold.
    local pids=()
    for pidfile in "$DIR"/slurmd.*.pid "$DIR"/slurmctld.pid; do
        [ -e "$pidfile" ] && pids+=("$(cat "$pidfile")")
    done
    [ ${#pids[@]} -gt 0 ] && { kill "${pids[@]}" 2>/dev/null || true; }
    for _ in $(seq 1 20); do
        kill -0 "${pids[@]}" 2>/dev/null || break
        sleep 0.25
    done
    [ ${#pids[@]} -eq 0 ] || kill -9 "${pids[@]}" 2>/dev/null || true
    rm -rf "$DIR/state" "$DIR/spool" "$DIR"/*.pid
}

status() {
    export SLURM_CONF=$CONF
    sinfo -N
}

case ${1:-} in
start) start "${2:-2}" ;;
stop) stop ;;
status) status ;;
*)
    echo "usage: $0 start [NODES] | stop | status" >&2
    exit 64
    ;;
esac
