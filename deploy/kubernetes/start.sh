#!/bin/sh
# How a fencelock pod of the StatefulSet in statefulset.yaml starts
# fencelockd. The ConfigMap `fencelock` there holds this very text (the pod
# runs that copy: /bin/sh /etc/fencelock/k8s/start.sh), and
# xtask/tests/kubernetes.rs checks that both are the same and runs it.
# POSIX sh only: the image's /bin/sh is Debian's dash.
#
# Pod NAME-N (N from $HOSTNAME) is node N+1. Pods 0 .. INITIAL_MEMBERS-1
# are the cluster's founding members; later ordinals are added by scaling
# up. What the pod finds in its data directory decides how it starts:
#
#   data directory          ordinal < INITIAL_MEMBERS   ordinal >= INITIAL_MEMBERS
#   fencelock-removed       wipe it, then --join the other initial members
#                           (the preStop hook, stop.sh, removed this node)
#   fencelock-joined        --join again (the same command as its first start)
#   raft/ (a restart)       --peers the initial members  --peers the initial
#                           (+ --initial-cluster-state)  members and itself
#                                                        (+ --initial-cluster-state)
#   blank                   --peers the initial members  --join the initial members,
#                           --initial-cluster-state      --peers itself only
#
# - A restart starts from its data: --peers are then only addresses to
#   first contact (the members live in the raft log), but fencelockd
#   requires its own --id among them, so a node added later names itself.
#   --initial-cluster-state is ignored by a node with data; it is passed
#   anyway, for a first start that stopped before it wrote anything (then
#   raft/ exists but holds nothing, and the setting decides).
# - A blank founding member founds the cluster or, if the cluster runs
#   already, rejoins it: INITIAL_CLUSTER_STATE (docs/operations.md,
#   "Starting a cluster"; statefulset.yaml says when to set `existing`).
# - A blank pod past the founding members joins: --join asks the cluster
#   to add it as a learner and promotes it once it has caught up; it never
#   founds a cluster. Under TLS fencelockd calls as $FENCELOCK_USER if set,
#   else as `admin` when client-admin.crt/.key are in the certificates
#   directory (the init container copies them from the Secret
#   fencelock-admin): an admin, who may add the node. Without either it
#   calls as the node itself, whose certificate may only confirm the entry
#   an admin's `fencelock member add` made for it (crates/server/src/join.rs).
# - fencelock-joined is written before the first --join start and kept: a
#   joined node always starts with --join, as docs/operations.md, "Grow the
#   cluster", starts one. A first join that failed (the cluster out of
#   reach, no admin certificate) leaves a raft/ directory with nothing in
#   it; started without --join, the node would wait for ever. With --join
#   it asks again, and a node with data starts from it and only finishes a
#   promotion left undone.
# - fencelock-removed is written by stop.sh when a scale-down removes the
#   node. Its data belongs to a node the cluster no longer has (started on
#   it, fencelockd would stop at once with exit code 3), so a later
#   scale-up wipes it (everything in the data directory but lost+found)
#   and joins the cluster anew.
#
# Environment: HOSTNAME (NAME-N; default: uname -n), POD_NAMESPACE,
# POD_IP, INITIAL_MEMBERS (default 3), INITIAL_CLUSTER_STATE (default new),
# SERVICE_NAME (the headless Service; default NAME), DATA_DIR (default
# /var/lib/fencelock), CERTS_DIR (default /run/fencelock/certs),
# CONFIG_FILE (default /etc/fencelock/k8s/fencelock.toml).
#
# FENCELOCK_DRY_RUN=1: print the fencelockd command line on stdout, one
# argument per line (the first is `fencelockd`), and exit 0, without
# waiting for DNS and without touching the data directory (what a real
# start would wipe or write is said on stderr). Otherwise the script waits
# until the pod's own name resolves to POD_IP, acts on the data directory
# and execs fencelockd with exactly those arguments.
set -eu

say() { printf 'start.sh: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

dry_run=${FENCELOCK_DRY_RUN:-0}
data_dir=${DATA_DIR:-/var/lib/fencelock}
certs_dir=${CERTS_DIR:-/run/fencelock/certs}
config_file=${CONFIG_FILE:-/etc/fencelock/k8s/fencelock.toml}
initial=${INITIAL_MEMBERS:-3}
cluster_state=${INITIAL_CLUSTER_STATE:-new}
namespace=${POD_NAMESPACE:?POD_NAMESPACE is not set}
# The pod's name: the container runtime sets HOSTNAME to it.
# shellcheck disable=SC3028
pod=${HOSTNAME:-$(uname -n)}

set_name=${pod%-*}
ordinal=${pod##*-}
case $ordinal in
    '' | *[!0-9]*) die "HOSTNAME $pod does not end in -ORDINAL" ;;
esac
case $initial in
    '' | *[!0-9]* | 0) die "INITIAL_MEMBERS $initial is not a number of nodes" ;;
esac
id=$((ordinal + 1))
domain="${SERVICE_NAME:-$set_name}.$namespace.svc.cluster.local"
self="$pod.$domain"

removed_marker="$data_dir/fencelock-removed"
joined_marker="$data_dir/fencelock-joined"

# The founding members' peer addresses, and their client endpoints but
# this pod's own.
initial_peers=
initial_clients=
n=0
while [ "$n" -lt "$initial" ]; do
    initial_peers="$initial_peers${initial_peers:+,}$((n + 1))=$set_name-$n.$domain:7001"
    if [ "$n" -ne "$ordinal" ]; then
        initial_clients="$initial_clients${initial_clients:+,}$set_name-$n.$domain:7101"
    fi
    n=$((n + 1))
done
own_peer="$id=$self:7001"

wipe=no
if [ -e "$removed_marker" ]; then
    say "$removed_marker: this node was removed from the cluster; wiping $data_dir and joining anew"
    wipe=yes
    mode='join'
elif [ -e "$joined_marker" ]; then
    say "$joined_marker: this node joined the cluster with --join; starting it the same way"
    mode='join'
elif [ -e "$data_dir/raft" ]; then
    say "$data_dir/raft exists: a restart, from the data"
    mode='restart'
elif [ "$ordinal" -lt "$initial" ]; then
    say "blank data directory, founding member $id of $initial: --initial-cluster-state $cluster_state"
    mode='found'
else
    say "blank data directory, node $id is not a founding member: joining the cluster"
    mode='join'
fi
mark_joined=no
if [ "$mode" = join ] && { [ "$wipe" = yes ] || [ ! -e "$joined_marker" ]; }; then
    mark_joined=yes
fi

set -- fencelockd --id "$id"
case $mode in
    join)
        [ -n "$initial_clients" ] || die "no other founding member to --join"
        set -- "$@" --peers "$own_peer" --join "$initial_clients"
        ;;
    restart)
        if [ "$ordinal" -lt "$initial" ]; then
            set -- "$@" --peers "$initial_peers"
        else
            set -- "$@" --peers "$initial_peers,$own_peer"
        fi
        set -- "$@" --initial-cluster-state "$cluster_state"
        ;;
    found)
        set -- "$@" --peers "$initial_peers" --initial-cluster-state "$cluster_state"
        ;;
esac
set -- "$@" \
    --config "$config_file" \
    --client-addr 0.0.0.0:7101 \
    --advertise-client-addr "$self:7101" \
    --data-dir "$data_dir" \
    --certs-dir "$certs_dir" \
    --metrics-addr 0.0.0.0:9101 \
    --insecure \
    --log-format json

if [ "$dry_run" = 1 ]; then
    [ "$wipe" = no ] || say "dry run: would wipe $data_dir (all but lost+found)"
    [ "$mark_joined" = no ] || say "dry run: would write $joined_marker"
    printf '%s\n' "$@"
    exit 0
fi

# fencelockd binds its peer port on its own --peers name, so wait until
# that name resolves to this pod.
pod_ip=${POD_IP:?POD_IP is not set}
until [ "$(getent hosts "$self" | cut -d ' ' -f 1)" = "$pod_ip" ]; do
    say "waiting for $self to resolve to $pod_ip"
    sleep 1
done

if [ "$wipe" = yes ]; then
    # The removed marker goes last: a wipe cut short is done again.
    for entry in "$data_dir"/* "$data_dir"/.[!.]* "$data_dir"/..?*; do
        [ -e "$entry" ] || [ -L "$entry" ] || continue
        case $entry in
            "$data_dir/lost+found" | "$removed_marker") ;;
            *) rm -rf -- "$entry" ;;
        esac
    done
fi
if [ "$mark_joined" = yes ]; then
    printf 'node %s started with --join on %s\n' "$id" "$(date -u '+%Y-%m-%dT%H:%M:%SZ')" \
        >"$joined_marker"
fi
if [ "$wipe" = yes ]; then
    rm -f -- "$removed_marker"
fi
exec "$@"
