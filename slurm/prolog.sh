#!/bin/sh
# Slurm node prolog for fanfs: before a job starts on a node, make sure its user may mount with FUSE there.
# In slurm.conf, on every compute node:
#
#   Prolog=/opt/fanfs/slurm/prolog.sh
#
# /dev/fuse must be open to every user (crw-rw-rw-, as distributions ship it; fusermount3 opens it as the user).
# Some images keep it root's alone: this opens it again.  A udev rule does the same once for good (see the admin
# page); so does a node's boot.  It never fails a job: a node without FUSE is no fault of the job's (fanfs says what
# to ask for, and FANFS_MOUNT=0 reads without a mount).  Its argument, for a test: another device node.
device=${1:-/dev/fuse}
[ -c "$device" ] || modprobe fuse 2>/dev/null
[ -c "$device" ] && chmod 0666 "$device"
exit 0
