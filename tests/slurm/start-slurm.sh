#!/usr/bin/env bash
# start-slurm.sh - install, configure and start a single-node SLURM cluster on
# Debian 12 (bookworm), as root, without systemd (daemons are started by hand).
# tests/test_slurm.py runs the pipeline through profiles/slurm on it; it is also a sandbox
# for trying the profile on one machine (docs/cluster.md).
# Tested in a gVisor sandbox (2 cores, 24 GB) with Debian's slurm-wlm 22.05.8,
# munge 0.5.15, mariadb 10.11 and snakemake 9.27.1 + snakemake-executor-plugin-slurm 2.8.0.
#
# Idempotent: packages are installed only if missing, configs are rewritten, and
# daemons that are already running are left alone (restarted only if slurm.conf,
# gres.conf or slurmdbd.conf changed).
#
# Usage:  bash start-slurm.sh [start|stop|status]      (default: start)
#
# Environment knobs (all optional):
#   SLURM_ACCOUNTING=1    1: also install MariaDB + slurmdbd, so `sacct`/`sacctmgr`
#                         work and the Snakemake plugin runs with its defaults.
#                         0: no accounting (lighter); then Snakemake MUST get
#                         `--slurm-status-command squeue`, else it waits forever.
#   SLURM_FAKE_GPUS=2     fake GPUs declared as gres/gpu (device files are
#                         symlinks to /dev/null); 0 = no GRES.
#   SLURM_PARTITION=main  name of the (default) partition.
#   SLURM_CPUS=$(nproc)   CPUs advertised; more than nproc oversubscribes.
#   SLURM_ACCOUNT=none    account created in slurmdbd for root (accounting mode),
#                         so that `--default-resources slurm_account=none` validates.
#   SLURM_CLUSTER=ci      ClusterName.
set -euo pipefail

ACTION=${1:-start}
ACCOUNTING=${SLURM_ACCOUNTING:-1}
FAKE_GPUS=${SLURM_FAKE_GPUS:-2}
PARTITION=${SLURM_PARTITION:-main}
CPUS=${SLURM_CPUS:-$(nproc)}
ACCOUNT=${SLURM_ACCOUNT:-none}
CLUSTER=${SLURM_CLUSTER:-ci}
HOST=$(hostname -s)
MEM=$(( $(free -m | awk '/^Mem:/{print $2}') - 1024 ))
LOG=/var/log/slurm
RUN=/run/slurm
GPUDIR=/var/lib/slurm/fake-gpu
DB_PASS=slurmdbpass

log() { echo "[start-slurm] $*" >&2; }

# --- pid helpers (daemons are tracked by their pid files only) --------------
pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
stop_pidfile() {  # stop_pidfile NAME PIDFILE
  local pf=$2 pid i
  if pid_alive "$pf"; then
    pid=$(cat "$pf"); log "stopping $1 (pid $pid)"; kill "$pid" || true
    for i in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then log "$1 still alive, SIGKILL"; kill -9 "$pid" || true; fi
  fi
  rm -f "$pf"
}
wait_for() {  # wait_for SECONDS DESCRIPTION CMD...
  local secs=$1 what=$2 i; shift 2
  for i in $(seq 1 $((secs * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  log "timed out after ${secs}s waiting for: $what"; return 1
}

# run a daemon with stdio on /dev/null (or a log) and every other inherited fd
# closed, so it never holds a pipe of the caller (e.g. CI's output capture) open
detach() {  # detach [--bg] LOGFILE CMD...   (--bg: for daemons that stay in the foreground)
  local bg=0 logf
  if [ "$1" = --bg ]; then bg=1; shift; fi
  logf=$1; shift
  if [ "$bg" = 1 ]; then
    ( _closefds; exec setsid "$@" ) </dev/null >>"$logf" 2>&1 &
  else
    ( _closefds; exec "$@" ) </dev/null >>"$logf" 2>&1
  fi
}
_closefds() {
  local fd
  for fd in $(ls /proc/$BASHPID/fd); do
    [ "$fd" -gt 2 ] && eval "exec $fd>&-" 2>/dev/null || true
  done
}

do_stop() {
  stop_pidfile slurmd "$RUN/slurmd.pid"
  stop_pidfile slurmctld "$RUN/slurmctld.pid"
  stop_pidfile slurmdbd "$RUN/slurmdbd.pid"
  stop_pidfile mariadbd /run/mysqld/mysqld.pid
  stop_pidfile munged /run/munge/munged.pid
}

do_status() {
  local n
  for n in "$RUN/slurmctld.pid" "$RUN/slurmd.pid" "$RUN/slurmdbd.pid" \
           /run/mysqld/mysqld.pid /run/munge/munged.pid; do
    if pid_alive "$n"; then echo "running  $(cat "$n")  $n"; else echo "stopped  -  $n"; fi
  done
  sinfo 2>/dev/null || true
}

install_packages() {
  local pkgs=(slurm-wlm munge) need=0 b
  [ "$ACCOUNTING" = 1 ] && pkgs+=(slurmdbd mariadb-server)
  for b in slurmctld slurmd munged sinfo sbatch; do command -v "$b" >/dev/null || need=1; done
  if [ "$ACCOUNTING" = 1 ]; then
    for b in slurmdbd mariadbd; do command -v "$b" >/dev/null || [ -x "/usr/sbin/$b" ] || need=1; done
  fi
  [ "$need" = 0 ] && return 0
  log "installing ${pkgs[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
}

# write_if_changed FILE MODE OWNER  (content on stdin); returns 0 if it changed
write_if_changed() {
  local f=$1 tmp; tmp=$(mktemp)
  cat >"$tmp"
  if [ -f "$f" ] && cmp -s "$tmp" "$f"; then rm -f "$tmp"; return 1; fi
  install -m "$2" -o "${3%:*}" -g "${3#*:}" "$tmp" "$f"; rm -f "$tmp"; return 0
}

start_munge() {
  install -d -o munge -g munge -m 0755 /run/munge
  install -d -o munge -g munge -m 0700 /var/log/munge /etc/munge
  install -d -o munge -g munge -m 0711 /var/lib/munge
  if [ ! -s /etc/munge/munge.key ]; then
    log "creating munge key"; mungekey --create --keyfile=/etc/munge/munge.key
  fi
  chown munge:munge /etc/munge/munge.key; chmod 0400 /etc/munge/munge.key
  if ! pid_alive /run/munge/munged.pid; then
    log "starting munged"; detach /dev/null runuser -u munge -- /usr/sbin/munged
  fi
  wait_for 20 "munge" bash -c 'munge -n | unmunge'
}

start_mariadb() {
  install -d -o mysql -g mysql -m 0755 /run/mysqld
  if ! pid_alive /run/mysqld/mysqld.pid; then
    if [ ! -d /var/lib/mysql/mysql ]; then
      log "initialising mariadb datadir"; mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
    fi
    log "starting mariadbd"
    detach --bg "$LOG/mariadb.log" /usr/sbin/mariadbd --user=mysql --bind-address=127.0.0.1
  fi
  wait_for 60 "mariadb" mariadb-admin ping
  mariadb -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
}

write_configs() {  # prints "changed" if slurm.conf/gres.conf/slurmdbd.conf changed
  local changed=0 gres_node="" acct
  if [ "$FAKE_GPUS" -gt 0 ]; then
    install -d -m 0755 "$GPUDIR"
    for i in $(seq 0 $((FAKE_GPUS - 1))); do ln -sfn /dev/null "$GPUDIR/nvidia$i"; done
    gres_node=" Gres=gpu:$FAKE_GPUS"
  fi
  if [ "$ACCOUNTING" = 1 ]; then
    acct="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
AccountingStorageTRES=gres/gpu"
  else
    acct="AccountingStorageType=accounting_storage/none"
  fi
  write_if_changed /etc/slurm/slurm.conf 0644 root:root <<EOF && changed=1
# written by start-slurm.sh: single-node cluster, no cgroups (works in containers)
ClusterName=$CLUSTER
SlurmctldHost=$HOST
SlurmUser=slurm
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
$acct
ReturnToService=2
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
MinJobAge=300
InactiveLimit=0
KillWait=5
Waittime=0
GresTypes=gpu
NodeName=$HOST CPUs=$CPUS RealMemory=$MEM$gres_node State=UNKNOWN
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  {
    echo "# written by start-slurm.sh: fake GPUs (links to /dev/null)"
    echo "AutoDetect=off"
    [ "$FAKE_GPUS" -gt 0 ] && echo "NodeName=$HOST Name=gpu File=$GPUDIR/nvidia[0-$((FAKE_GPUS - 1))]"
    true
  } | write_if_changed /etc/slurm/gres.conf 0644 root:root && changed=1
  if [ "$ACCOUNTING" = 1 ]; then
    write_if_changed /etc/slurm/slurmdbd.conf 0600 slurm:slurm <<EOF && changed=1
# written by start-slurm.sh: accounting on the local MariaDB
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=slurm
LogFile=$LOG/slurmdbd.log
PidFile=$RUN/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
  fi
  [ "$changed" = 1 ] && echo changed || true
}

wait_node_up() {  # wait until the node is usable; resume it once if drained/down
  local i st resumed=0
  for i in $(seq 1 300); do
    st=$(sinfo -h -n "$HOST" -o %T 2>/dev/null || true)
    case "$st" in
      idle|mixed|allocated|completing) return 0 ;;
      *drain*|down)  # a DRAIN/DOWN kept in saved state survives restarts
        if [ "$resumed" = 0 ]; then
          log "node $HOST is $st: resuming"; scontrol update nodename="$HOST" state=resume || true
          resumed=1
        fi ;;
    esac
    sleep 0.2
  done
  log "node $HOST not usable after 60s (state: ${st:-?})"; return 1
}

do_start() {
  [ "$(id -u)" = 0 ] || { log "must run as root"; exit 1; }
  install_packages
  getent hosts "$HOST" >/dev/null || echo "127.0.0.1 $HOST" >>/etc/hosts
  install -d -o slurm -g slurm -m 0755 "$RUN" "$LOG" /var/lib/slurm/slurmctld
  install -d -m 0755 /var/lib/slurm/slurmd /etc/slurm
  start_munge
  [ "$ACCOUNTING" = 1 ] && start_mariadb
  if [ "$(write_configs)" = changed ]; then
    log "configuration changed: (re)starting slurm daemons"
    stop_pidfile slurmd "$RUN/slurmd.pid"
    stop_pidfile slurmctld "$RUN/slurmctld.pid"
    stop_pidfile slurmdbd "$RUN/slurmdbd.pid"
  fi
  if [ "$ACCOUNTING" = 1 ]; then
    if ! pid_alive "$RUN/slurmdbd.pid"; then log "starting slurmdbd"; detach /dev/null /usr/sbin/slurmdbd; fi
    wait_for 60 "slurmdbd" sacctmgr -n list cluster
  fi
  if ! pid_alive "$RUN/slurmctld.pid"; then log "starting slurmctld"; detach /dev/null /usr/sbin/slurmctld; fi
  if ! pid_alive "$RUN/slurmd.pid"; then log "starting slurmd"; detach /dev/null /usr/sbin/slurmd; fi
  wait_node_up
  if [ "$ACCOUNTING" = 1 ] && [ -n "$ACCOUNT" ]; then
    wait_for 30 "cluster $CLUSTER registered in slurmdbd" \
      bash -c "sacctmgr -n -P list cluster format=cluster | grep -qx $CLUSTER"
    if ! sacctmgr -n -P list account "$ACCOUNT" format=account | grep -qx "$ACCOUNT"; then
      sacctmgr -i add account "$ACCOUNT" Description=ci Organization=ci >/dev/null
    fi
    if ! sacctmgr -n -P -s list user root format=account | grep -qx "$ACCOUNT"; then
      sacctmgr -i add user root account="$ACCOUNT" >/dev/null
    fi
  fi
  timeout 60 srun -N1 -n1 -t 1 true
  log "cluster up: partition=$PARTITION cpus=$CPUS mem=${MEM}M gpus=$FAKE_GPUS accounting=$ACCOUNTING"
  if [ "$ACCOUNTING" = 1 ]; then
    log "snakemake: --executor slurm --default-resources slurm_partition=$PARTITION slurm_account=$ACCOUNT --slurm-init-seconds-before-status-checks 1"
  else
    log "snakemake: --executor slurm --default-resources slurm_partition=$PARTITION --slurm-status-command squeue --slurm-init-seconds-before-status-checks 1"
  fi
}

case "$ACTION" in
  start) do_start ;;
  stop) do_stop ;;
  status) do_status ;;
  *) echo "usage: $0 [start|stop|status]" >&2; exit 2 ;;
esac
