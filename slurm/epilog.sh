#!/bin/bash
# Slurm node epilog for fanfs: on every node of a job, once the job has ended there, end and remove what fanfs
# left of it (its mounts, dead ones too, its daemons, its directories fanfs-JOBID-NODE-*, their sockets), whatever
# way the job ended: 'fanfs cleanup' (fanfs cleanup --help).  In slurm.conf, on every compute node:
#
#   Epilog=/opt/fanfs/slurm/epilog.sh
#
# Slurm runs it as root with an environment of its own (no PATH, none of the job's variables but SLURM_JOB_ID,
# SLURM_JOB_UID and SLURMD_NODENAME), so the settings are here (an environment variable of that name wins, for a
# wrapper):
#   FANFS           the fanfs command, by its full path
#   FANFS_LOCAL_DIRS  node-local directories where jobs keep their shards (their FANFS_LOCAL, TMPDIR), besides
#                   /tmp and /dev/shm, space-separated
#   FANFS_SHARED_LOCAL  the nodes' directory of shared copies of stores, {node} for the node's name, if the site
#                   has one (docs/shared.rst): the copies no job reads go ('fanfs shared prune'), beyond
#                   FANFS_SHARED_KEEP (e.g. 500G: the most recently staged kept while all fit)
# Run it before anything of the site's epilog that wipes node-local storage: a directory that holds a mount cannot
# be removed ("Is a directory"), and this unmounts first.  What it did goes to syslog (tag fanfs-epilog) when there
# is one, else to Slurm.  It exits 1 if something of the job could not be ended or removed (a daemon stuck on a
# stalled file system, say): Slurm then drains the node, for an administrator to look (fanfs cleanup says what).
FANFS=${FANFS:-/opt/fanfs/bin/fanfs}
FANFS_LOCAL_DIRS=${FANFS_LOCAL_DIRS:-}
FANFS_SHARED_LOCAL=${FANFS_SHARED_LOCAL:-}
export PATH=/usr/sbin:/usr/bin:/sbin:/bin FANFS_SHARED_KEEP=${FANFS_SHARED_KEEP:-0}

locals=()
for dir in $FANFS_LOCAL_DIRS; do locals+=(--local "$dir"); done
epilog() {
    local status=0
    $FANFS cleanup --job "$SLURM_JOB_ID" --user "$SLURM_JOB_UID" --node "$SLURMD_NODENAME" "${locals[@]}" || status=1
    shared=${FANFS_SHARED_LOCAL//\{node\}/$SLURMD_NODENAME}
    if [ -n "$shared" ] && [ -d "$shared" ]; then
        $FANFS shared prune "$shared" || status=1
    fi
    return $status
}
if [ -S /dev/log ] && command -v logger >/dev/null; then
    epilog 2>&1 | logger -t fanfs-epilog
    exit "${PIPESTATUS[0]}"
fi
epilog
