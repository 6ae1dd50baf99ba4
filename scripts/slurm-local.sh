#!/usr/bin/env bash
# A real one-node SLURM cluster on this machine, for trying and testing SLURM jobs.
#
#   scripts/slurm-local.sh up     [STATE_DIR]   install (if needed), configure, start, wait idle
#   scripts/slurm-local.sh down   [STATE_DIR]   cancel jobs, stop the daemons it started, by PID
#   scripts/slurm-local.sh status [STATE_DIR]   daemons, node and jobs
#   scripts/slurm-local.sh install              only install the Debian packages
#
# STATE_DIR (default: $SLURM_LOCAL_DIR or /tmp/slurm-local) holds everything: slurm.conf,
# controller state, spool, logs, PID files and bin/sacct; munge/ links to our munged's
# folder in /tmp (see start_munge). Nothing global changes besides installing packages:
# /etc/slurm and /etc/munge are not touched. `up` prints the environment to use on stdout
# (progress goes to stderr), so this works:
#
#   eval "$(scripts/slurm-local.sh up)"     # sets SLURM_CONF and puts $STATE_DIR/bin on PATH
#   sbatch --wrap "hostname"; squeue; ...
#   scripts/slurm-local.sh down
#
# Exit codes: 0 ok; 1 failed (logs are printed); 3 this machine cannot run the cluster (not
# root, no apt-get, install refused, ports taken): the reason is the last line on stderr.
#
# Environment knobs: SLURM_LOCAL_PARTITION (debug), SLURM_LOCAL_AUTH (munge | none),
# SLURM_LOCAL_CTLD_PORT (6817), SLURM_LOCAL_SLURMD_PORT (6818), SLURM_LOCAL_TIMEOUT (30 s
# for the node to become idle), SLURM_LOCAL_CRED_EXPIRE (10 s, see below),
# SLURM_LOCAL_FIRST_JOB_ID (see first_job_id).
#
# Why these settings (measured on Debian bookworm, Slurm 22.05):
# - proctrack/linuxproc + task/none: no cgroups needed, works in containers and VMs alike.
# - DefMemPerCPU: without it a job gets all the node's memory and the others queue behind it.
# - AuthInfo=cred_expire=10: a requeued job may start again after ~11 s instead of 120 s
#   (5 worked too, ~6 s; it is also how long a job step's launch credential is valid).
# - SchedulerParameters=sched_interval=1: nothing but the periodic scheduler pass starts a
#   requeued job once it may run again; the default pass (60 s) and backfill (30 s) made
#   a requeue take 20-40 s instead of ~11 s.
# - MinJobAge high: finished jobs stay visible to squeue/scontrol, which bin/sacct reads
#   (there is no real sacct without slurmdbd + a database; submitit polls sacct and waits
#   forever on a job that ended without a result when sacct is missing).
# - auth/munge by default, with a fresh random key of its own: slurmctld listens on every
#   interface, and auth/none would let anyone who can reach port 6817 run commands as root.
#   SLURM_LOCAL_AUTH=none skips munge (one daemon fewer) on a machine nobody else can reach.
set -euo pipefail

PACKAGES=(slurmctld slurmd slurm-client munge)
PARTITION=${SLURM_LOCAL_PARTITION:-debug}
AUTH=${SLURM_LOCAL_AUTH:-munge}
CTLD_PORT=${SLURM_LOCAL_CTLD_PORT:-6817}
SLURMD_PORT=${SLURM_LOCAL_SLURMD_PORT:-6818}
TIMEOUT=${SLURM_LOCAL_TIMEOUT:-30}

say() { echo "slurm-local: $*" >&2; }
die() { say "error: $*"; exit 1; }
# "this machine cannot run it": callers (the pytest fixture) skip instead of failing
cannot() { say "cannot start: $*"; exit 3; }

usage() {
    sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

# -- installation -----------------------------------------------------------------------

missing_packages() {
    local pkg
    for pkg in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}\n' "$pkg" 2>/dev/null | grep -q '^install ok installed$' \
            || echo "$pkg"
    done
}

install_packages() {
    command -v dpkg-query >/dev/null 2>&1 || cannot "no dpkg here (this script needs Debian/Ubuntu packages)"
    local missing
    missing=$(missing_packages | tr '\n' ' ')
    [ -z "${missing// /}" ] && return 0
    [ "$(id -u)" -eq 0 ] || cannot "packages $missing are missing and installing them needs root"
    command -v apt-get >/dev/null 2>&1 || cannot "packages $missing are missing and there is no apt-get"
    say "installing $missing(apt-get, --no-install-recommends)"

    # Package scripts would try to start the services (there is no systemd here): a
    # policy-rc.d that answers 101 ("action forbidden") makes invoke-rc.d skip that. An
    # existing policy file is kept aside and restored.
    local policy=/usr/sbin/policy-rc.d
    POLICY_BACKUP=""
    if [ -e "$policy" ]; then
        POLICY_BACKUP=$(mktemp /usr/sbin/policy-rc.d.slurm-local.XXXXXX)
        cp -p "$policy" "$POLICY_BACKUP"
    fi
    trap restore_policy EXIT  # also when interrupted
    printf '#!/bin/sh\n# temporary, from slurm-local.sh: do not start services\nexit 101\n' >"$policy"
    chmod 0755 "$policy"

    local log ok=1
    log=$(mktemp)
    local apt=(apt-get install -y -q --no-install-recommends -o Dpkg::Use-Pty=0)
    # shellcheck disable=SC2086  # word-split the package list
    if ! DEBIAN_FRONTEND=noninteractive "${apt[@]}" $missing >"$log" 2>&1; then
        # most often the package lists are missing (fresh machine): update once, try again
        say "install failed without 'apt-get update'; updating the package lists"
        DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$log" 2>&1 &&
            DEBIAN_FRONTEND=noninteractive "${apt[@]}" $missing >>"$log" 2>&1 || ok=0
    fi
    restore_policy
    trap - EXIT
    if [ $ok = 0 ]; then
        tail -n 15 "$log" >&2
        rm -f "$log"
        cannot "apt-get could not install $missing(see the output above)"
    fi
    rm -f "$log"
    missing=$(missing_packages | tr '\n' ' ')
    [ -z "${missing// /}" ] || cannot "apt-get ran but $missing is still not installed"
}

# put back the machine's own policy-rc.d (or remove ours when there was none)
restore_policy() {
    if [ -n "${POLICY_BACKUP:-}" ]; then
        mv -f "$POLICY_BACKUP" /usr/sbin/policy-rc.d
    else
        rm -f /usr/sbin/policy-rc.d
    fi
    POLICY_BACKUP=""
}

# -- helpers ----------------------------------------------------------------------------

# PID from a PID file, if that process is alive
live_pid() {
    local file=$1 pid
    [ -s "$file" ] || return 1
    pid=$(tr -dc '0-9' <"$file")
    [ -n "$pid" ] && alive "$pid" && echo "$pid"
}

# is anything listening on TCP port $1 (IPv4 or IPv6)? Read from /proc: no ss/netstat needed
port_in_use() {
    local hex
    hex=$(printf '%04X' "$1")
    # column 2 is local address:port in hex, column 4 the state (0A = LISTEN)
    awk -v port="$hex" 'NR > 1 { split($2, a, ":"); if (a[length(a)] == port && $4 == "0A") found = 1 }
        END { exit !found }' /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# who holds port $1, for the message (best effort)
port_owner() {
    if command -v ss >/dev/null 2>&1; then
        ss -Hltnp "sport = :$1" 2>/dev/null | sed -n 's/.*users:((\(.*\)))/\1/p' | head -n 1
    fi
}

wait_until() {  # wait_until SECONDS DESCRIPTION COMMAND...: poll every 0.2 s
    local timeout=$1 what=$2
    shift 2
    local deadline=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            say "timed out after ${timeout}s waiting for $what"
            return 1
        fi
        sleep 0.2
    done
}

# the slurmstepd processes of this cluster: they inherited SLURM_CONF=<our conf> from our
# slurmd, which is what tells them apart from any other cluster's on the machine
our_stepds() {
    local dir pid
    for dir in /proc/[0-9]*; do
        pid=${dir#/proc/}
        [ "$(cat "$dir/comm" 2>/dev/null)" = slurmstepd ] || continue
        # (the process may be gone by now: no message for that)
        { tr '\0' '\n' <"$dir/environ"; } 2>/dev/null | grep -qxF "SLURM_CONF=$CONF" && echo "$pid"
    done
    return 0
}

# is process $1 running? (a zombie has exited: it only waits for its parent to reap it)
alive() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }  # the fields after "pid (comm) "; the first is the state
    [ "${stat%% *}" != Z ]
}

all_gone() {
    local pid
    for pid in "$@"; do alive "$pid" && return 1; done
    return 0
}

# stop processes by PID ("name:pid" pairs): SIGTERM to all at once, SIGKILL to those still
# there after GRACE seconds
stop_pids() {
    local grace=$1 item pids=()
    shift
    for item in "$@"; do
        kill -TERM "${item#*:}" 2>/dev/null && pids+=("${item#*:}")
    done
    [ ${#pids[@]} -eq 0 ] && return 0
    wait_until "$grace" "$* to exit" all_gone "${pids[@]}" && return 0
    for item in "$@"; do
        if alive "${item#*:}"; then
            say "killing ${item%%:*} (pid ${item#*:})"
            kill -KILL "${item#*:}" 2>/dev/null || true
        fi
    done
    wait_until 5 "$* to die" all_gone "${pids[@]}" || say "warning: $* survived SIGKILL"
}

print_logs() {
    local f
    for f in "$STATE"/log/*.log "$STATE"/munge/munged.log; do
        [ -s "$f" ] || continue
        say "---- last lines of $f"
        tail -n 20 "$f" >&2
    done
}

# -- configuration ----------------------------------------------------------------------

write_config() {
    local host cpus mem_mb
    host=$(hostname -s)
    cpus=$(nproc --all)
    mem_mb=$(awk '/^MemTotal:/ { printf "%d", $2 / 1024 * 0.9 }' /proc/meminfo)
    mkdir -p "$STATE"/{ctld,spool,log,bin}

    local auth_lines
    if [ "$AUTH" = none ]; then
        auth_lines="AuthType=auth/none
CredType=cred/none
AuthInfo=cred_expire=${SLURM_LOCAL_CRED_EXPIRE:-10}"
    else
        auth_lines="AuthType=auth/munge
CredType=cred/munge
# our own munged (see munge/): its socket, and requeued jobs may restart after ~11 s
AuthInfo=socket=$(munge_dir)/munge.socket,cred_expire=${SLURM_LOCAL_CRED_EXPIRE:-10}"
    fi

    cat >"$CONF" <<EOF
# written by scripts/slurm-local.sh: a one-node cluster, everything under $STATE
ClusterName=local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
$auth_lines
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
# no cgroups: plain process tracking, no task binding
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
# cores and memory are the consumable resources; a job without --mem gets 1000 MB per CPU
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
# no accounting database
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# job ids go on from one 'up' to the next (+1 a second, see first_job_id) instead of
# starting at 1 again: run dirs named after the job (slurm-<id>.<step>) stay apart
FirstJobId=$(first_job_id)
# pre-emption tests: jobs can be requeued; finished jobs stay visible for a day
JobRequeue=1
MinJobAge=86400
# a node that was down comes back by itself; trust this file's hardware description
ReturnToService=2
SlurmdParameters=config_overrides
# cancel/requeue: SIGTERM, then SIGKILL after 5 s (default 30); no limit on idle srun
KillWait=5
InactiveLimit=0
# a scheduling pass every second (default 60 s): it is what starts a requeued job once its
# credential expired (see AuthInfo), so a requeue takes ~11 s
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=$PARTITION Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
    write_sacct
}

# The first job id of a fresh cluster: the seconds since 2020 (wrapping below MaxJobId,
# 67043328, every ~2 years), so that clusters started one after the other do not hand out
# the same ids unless one submitted more than a job a second. SLURM_LOCAL_FIRST_JOB_ID=1
# gives the usual 1, 2, 3...
first_job_id() {
    if [ -n "${SLURM_LOCAL_FIRST_JOB_ID:-}" ]; then
        echo "$SLURM_LOCAL_FIRST_JOB_ID"
    else
        echo $(( ($(date +%s) - 1577836800) % 60000000 + 1 ))
    fi
}

# A stand-in for `sacct` (the real one needs slurmdbd + a database). It answers the
# questions submitit and people ask, e.g. `sacct -o JobID,State,NodeList --parsable2 -j 12`,
# from `scontrol show job -o`, which still knows finished jobs for MinJobAge seconds.
write_sacct() {
    cat >"$STATE/bin/sacct" <<EOF
#!/usr/bin/env bash
# sacct stand-in written by scripts/slurm-local.sh for the cluster in $STATE.
# Supports: -o/--format FIELDS, -j/--jobs IDS (repeatable, comma lists), -P/--parsable2,
# -p/--parsable, -n/--noheader, -X/--allocations (steps are never listed anyway); other
# options are accepted and ignored. Fields: JobID JobIDRaw JobName State NodeList ExitCode
# Partition Elapsed Start End Submit Restarts (any other field prints empty).
export SLURM_CONF=\${SLURM_CONF:-$CONF}
EOF
    cat >>"$STATE/bin/sacct" <<'EOF'
fields="JobID,JobName,Partition,State,ExitCode"
ids="" header=1 sep="" trailing=""
while [ $# -gt 0 ]; do
    case $1 in
        -o|--format) fields=$2; shift ;;
        --format=*) fields=${1#*=} ;;
        -j|--jobs) ids="$ids,$2"; shift ;;
        --jobs=*) ids="$ids,${1#*=}" ;;
        -P|--parsable2) sep="|" ;;
        -p|--parsable) sep="|" trailing="|" ;;
        -n|--noheader) header=0 ;;
        -[a-zA-Z]) case $1 in -S|-E|-u|-A|-M|-s|-r) shift ;; esac ;;  # options with a value
    esac
    shift
done
scontrol show job -o 2>/dev/null | awk -v fields="$fields" -v ids="$ids" -v header="$header" \
    -v sep="$sep" -v trailing="$trailing" '
function field(name,    id) {
    if (name == "JobID") {
        if (v["ArrayJobId"] == "") return v["JobId"]
        id = v["ArrayTaskId"]
        return v["ArrayJobId"] "_" (id ~ /[-,]/ ? "[" id "]" : id)
    }
    if (name == "JobIDRaw") return v["JobId"]
    if (name == "JobName") return v["JobName"]
    if (name == "State") return v["JobState"]
    if (name == "NodeList") return (v["NodeList"] == "(null)" ? "None assigned" : v["NodeList"])
    if (name == "ExitCode") return v["ExitCode"]
    if (name == "Partition") return v["Partition"]
    if (name == "Elapsed") return v["RunTime"]
    if (name == "Start") return v["StartTime"]
    if (name == "End") return v["EndTime"]
    if (name == "Submit") return v["SubmitTime"]
    if (name == "Restarts") return v["Restarts"]
    return ""
}
BEGIN {
    nf = split(fields, names, ",")
    for (i = 1; i <= nf; i++) sub(/%.*/, "", names[i])   # JobName%30 -> JobName
    n_ids = split(ids, list, ",")
    for (i = 1; i <= n_ids; i++) if (list[i] != "") wanted[list[i]] = 1
    if (header) {
        line = ""
        for (i = 1; i <= nf; i++) line = line (i > 1 ? (sep == "" ? " " : sep) : "") names[i]
        print line trailing
    }
}
{
    # "Key=value Key=value ...": a value may contain spaces (JobName, Command), so a token
    # that does not start with Key= belongs to the previous value
    delete v
    key = ""
    for (i = 1; i <= NF; i++) {
        if (match($i, /^[A-Za-z][A-Za-z0-9_:\/]*=/)) {
            key = substr($i, 1, RLENGTH - 1)
            v[key] = substr($i, RLENGTH + 1)
        } else if (key != "") v[key] = v[key] " " $i
    }
    if (!("JobId" in v)) next
    if (n_ids > 0 && !((v["JobId"] in wanted) || (v["ArrayJobId"] in wanted) ||
                       (field("JobID") in wanted))) next
    line = ""
    for (i = 1; i <= nf; i++) line = line (i > 1 ? (sep == "" ? " " : sep) : "") field(names[i])
    print line trailing
}'
EOF
    chmod 0755 "$STATE/bin/sacct"
}

# -- munge ------------------------------------------------------------------------------

# Our own munged, as the munge user, with its own random key and socket: the machine's
# /etc/munge key and any running munged are left alone. munged insists that every folder
# above its socket is executable by all, which a private state dir (pytest's tmp folders
# are 0700) is not, so its files live in a fresh /tmp/slurm-local-munge.XXXXXX (0711, owned
# by munge, key 0400) and $STATE/munge is a link to it; `down` removes both.
start_munge() {
    id munge >/dev/null 2>&1 || die "no 'munge' user (the munge package creates it)"
    local dir
    dir=$(mktemp -d /tmp/slurm-local-munge.XXXXXX)
    ln -sfn "$dir" "$STATE/munge"
    dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 status=none
    chmod 0400 "$dir/munge.key"
    chmod 0711 "$dir"
    chown -R munge: "$dir"
    runuser -u munge -- /usr/sbin/munged \
        --key-file="$dir/munge.key" \
        --socket="$dir/munge.socket" \
        --pid-file="$dir/munged.pid" \
        --log-file="$dir/munged.log" \
        --seed-file="$dir/munged.seed" \
        || { cat "$dir/munged.log" >&2 2>/dev/null; die "munged did not start"; }
    wait_until 10 "munged's socket" test -S "$dir/munge.socket" || die "munged did not start"
}

# the real folder behind $STATE/munge (empty when there is none)
munge_dir() {
    [ -L "$STATE/munge" ] && readlink "$STATE/munge"
    return 0
}

# -- commands ---------------------------------------------------------------------------

cmd_up() {
    [ "$(id -u)" -eq 0 ] || cannot "the cluster runs its daemons as root (SlurmUser=root); run as root"
    [ -d /proc/self ] || cannot "no /proc"
    if live_pid "$STATE/slurmctld.pid" >/dev/null || live_pid "$STATE/slurmd.pid" >/dev/null; then
        say "already up in $STATE (use 'down' first to restart)"
        print_env
        return 0
    fi
    local port owner
    for port in "$CTLD_PORT" "$SLURMD_PORT"; do
        if port_in_use "$port"; then
            owner=$(port_owner "$port")
            cannot "TCP port $port is already in use${owner:+ by $owner} (another slurmctld/slurmd? stop it, or set SLURM_LOCAL_CTLD_PORT / SLURM_LOCAL_SLURMD_PORT)"
        fi
    done
    install_packages
    case $AUTH in munge|none) ;; *) die "SLURM_LOCAL_AUTH must be munge or none, not '$AUTH'" ;; esac

    local t0=$SECONDS
    mkdir -p "$STATE"
    STATE=$(cd "$STATE" && pwd -P)
    CONF=$STATE/slurm.conf
    remove_munge_dir  # a leftover of an earlier cluster in this state dir
    rm -rf "$STATE"/{ctld,spool,log}  # a fresh cluster every time: job ids restart at 1
    mkdir -p "$STATE"
    # anything started from here on is stopped again if `up` does not finish
    trap up_failed EXIT
    if [ "$AUTH" = munge ]; then start_munge; fi
    write_config
    export SLURM_CONF=$CONF
    # both daemonize and write their PID files (-c: start from a clean state)
    /usr/sbin/slurmctld -c -f "$CONF" || die "slurmctld did not start"
    /usr/sbin/slurmd -c -f "$CONF" || die "slurmd did not start"
    node_idle() { sinfo -h -N -o '%T' 2>/dev/null | grep -qx idle; }
    if ! wait_until "$TIMEOUT" "the node to become idle in sinfo" node_idle; then
        sinfo -N -l >&2 || true
        die "the node did not become idle within ${TIMEOUT}s (SLURM_LOCAL_TIMEOUT)"
    fi
    trap - EXIT
    say "up in $((SECONDS - t0))s: partition '$PARTITION', node $(hostname -s), $(nproc --all) CPUs; state in $STATE"
    say "use it with (sacct here is a stand-in that reads scontrol; submitit needs it):"
    print_env
}

# `up` did not finish: show why, and stop whatever it had started
up_failed() {
    say "up failed; stopping what was started"
    print_logs
    cmd_down >/dev/null 2>&1 || true
}

print_env() {
    echo "export SLURM_CONF=$CONF"
    echo "export PATH=$STATE/bin:\$PATH"
}

cmd_down() {
    [ -d "$STATE" ] || { say "nothing to stop: no $STATE"; return 0; }
    local pid ctld slurmd munge
    ctld=$(live_pid "$STATE/slurmctld.pid" || true)
    slurmd=$(live_pid "$STATE/slurmd.pid" || true)
    munge=$(live_pid "$STATE/munge/munged.pid" || true)
    if [ -n "$ctld" ] && [ -n "$slurmd" ]; then
        # jobs run under slurmstepd, which outlives slurmd: let SLURM end them first
        export SLURM_CONF=$CONF
        scancel --full --quiet --user=root 2>/dev/null || true
        no_jobs() { [ -z "$(squeue -h -t running,completing,configuring,suspended -o %i 2>/dev/null)" ]; }
        wait_until 20 "jobs to end" no_jobs || true
    fi
    # all at once: each daemon takes ~2 s to shut down, one after the other would take 6 s
    stop_pids 15 ${slurmd:+slurmd:$slurmd} ${ctld:+slurmctld:$ctld} ${munge:+munged:$munge}
    # a step that did not end with its job (or outlived a killed slurmd)
    for pid in $(our_stepds); do
        say "stopping leftover slurmstepd (pid $pid)"
        stop_pids 5 "slurmstepd:$pid"
    done
    rm -f "$STATE"/slurmctld.pid "$STATE"/slurmd.pid
    remove_munge_dir
    say "down: ${ctld:+slurmctld $ctld }${slurmd:+slurmd $slurmd }${munge:+munged $munge }stopped"
}

# remove our munged's folder (key, socket, logs) and the link to it, once munged is gone
remove_munge_dir() {
    local dir
    dir=$(munge_dir)
    case $dir in
        /tmp/slurm-local-munge.*)
            if live_pid "$dir/munged.pid" >/dev/null; then
                say "warning: munged still runs; leaving $dir"
                return 0
            fi
            rm -rf "$dir" ;;
    esac
    rm -f "$STATE/munge"
}

cmd_status() {
    local name file pid rc=0
    for name in slurmctld slurmd munged; do
        file=$STATE/$name.pid
        [ $name = munged ] && file=$STATE/munge/munged.pid
        if pid=$(live_pid "$file"); then
            echo "$name: running (pid $pid)"
        else
            echo "$name: not running"
            [ $name = munged ] && [ "$AUTH" = none ] || rc=1
        fi
    done
    if [ $rc -eq 0 ]; then
        export SLURM_CONF=$CONF
        sinfo -N -l
        squeue -t all
    fi
    return $rc
}

main() {
    local cmd=${1:-}
    STATE=${2:-${SLURM_LOCAL_DIR:-/tmp/slurm-local}}
    if [ -d "$STATE" ]; then STATE=$(cd "$STATE" && pwd -P); fi
    CONF=$STATE/slurm.conf
    # a state dir that was started with auth/none has no munge/ folder
    if [ "$cmd" != up ] && [ -f "$CONF" ] && grep -q '^AuthType=auth/none' "$CONF"; then AUTH=none; fi
    case $cmd in
        up) cmd_up ;;
        down) cmd_down ;;
        status) cmd_status ;;
        install) install_packages; say "packages present: ${PACKAGES[*]}" ;;
        *) usage ;;
    esac
}

main "$@"
