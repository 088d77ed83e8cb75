#!/bin/sh
# The preStop hook of a fencelock pod of the StatefulSet in
# statefulset.yaml: on a scale-down, remove this node from the cluster. The
# ConfigMap `fencelock` there holds this very text (the pod runs that copy:
# /bin/sh /etc/fencelock/k8s/stop.sh), and xtask/tests/kubernetes.rs checks
# that both are the same and runs it. POSIX sh only (Debian's dash).
#
# A pod stops for many reasons: a rolling update, `kubectl delete pod`, a
# node drain, a scale-down. Only the last one must remove the node; after
# the others the pod comes back with its data and its place in the
# cluster. So the hook asks the Kubernetes API for the StatefulSet's
# spec.replicas now (its scale subresource, with the pod's service account
# token) and decides:
#
#   spec.replicas                   the hook
#   ordinal < replicas              removes nothing: the pod comes back
#   ordinal >= replicas (> 0)       `fencelock member remove ID` at the client
#                                   endpoints of pods 0 .. replicas-1
#   0 (scaled to zero)              removes nothing: a pause, not a shrink
#                                   (removing every node would lose the data)
#   the StatefulSet is gone (404)   removes nothing: deleting the StatefulSet
#                                   is not shrinking the cluster
#   no answer, or one it can't read removes nothing, exits 1 (a
#                                   FailedPreStopHook event says why)
#
# Before the removal it writes the marker fencelock-removed into the data
# directory: the node stops on its own (exit code 3) as soon as it applies
# its removal, which ends the container and this hook with it, perhaps
# before the answer arrives. If the removal fails, the hook deletes the
# marker again and exits 1: the node stays a member (a dead voter once the
# pod is gone; remove it by hand with `fencelock member remove ID`, then
# delete the pod's PersistentVolumeClaim). A marker whose removal did not
# in fact happen is harmless: start.sh wipes the data and joins with
# --join, which finds the node a voter already and rejoins it as a node
# that lost its data (docs/operations.md, "The data directory").
#
# Concurrent removals (a scale-down by two) are one membership change at a
# time; the CLI retries "under way" answers within --retry-for.
#
# Environment: HOSTNAME (NAME-N; default: uname -n), POD_NAMESPACE,
# FENCELOCK_USER (default admin), DATA_DIR (default /var/lib/fencelock),
# CERTS_DIR (default /run/fencelock/certs), SERVICE_NAME (default NAME),
# SERVICEACCOUNT_DIR (default
# /var/run/secrets/kubernetes.io/serviceaccount).
#
# FENCELOCK_DRY_RUN=1 with REPLICAS=N: no API call (spec.replicas is N), no
# marker, no removal. The decision goes to stderr, and when it is to
# remove, the fencelock command line to stdout, one argument per line (the
# first is `fencelock`); nothing on stdout otherwise. Exit code 0.
set -eu

say() { printf 'stop.sh: %s\n' "$*" >&2; }

dry_run=${FENCELOCK_DRY_RUN:-0}
data_dir=${DATA_DIR:-/var/lib/fencelock}
certs_dir=${CERTS_DIR:-/run/fencelock/certs}
user=${FENCELOCK_USER:-admin}
sa_dir=${SERVICEACCOUNT_DIR:-/var/run/secrets/kubernetes.io/serviceaccount}
# The pod's name: the container runtime sets HOSTNAME to it.
# shellcheck disable=SC3028
pod=${HOSTNAME:-$(uname -n)}

set_name=${pod%-*}
ordinal=${pod##*-}
case $ordinal in
    '' | *[!0-9]*) say "HOSTNAME $pod does not end in -ORDINAL; removing nothing"; exit 1 ;;
esac
id=$((ordinal + 1))
namespace=${POD_NAMESPACE:-}
if [ -z "$namespace" ] && [ -r "$sa_dir/namespace" ]; then
    namespace=$(cat "$sa_dir/namespace")
fi
[ -n "$namespace" ] || { say "POD_NAMESPACE is not set; removing nothing"; exit 1; }
domain="${SERVICE_NAME:-$set_name}.$namespace.svc.cluster.local"
nl='
'

if [ "$dry_run" = 1 ]; then
    replicas=${REPLICAS:?a dry run takes spec.replicas from REPLICAS}
else
    url="https://kubernetes.default.svc/apis/apps/v1/namespaces/$namespace/statefulsets/$set_name/scale"
    token=$(cat "$sa_dir/token") || { say "no service account token in $sa_dir; removing nothing"; exit 1; }
    # The token goes in on stdin (curl --config -), not on the command line.
    if ! answer=$(printf 'header = "Authorization: Bearer %s"\n' "$token" |
        curl --config - --silent --show-error --max-time 10 --cacert "$sa_dir/ca.crt" \
            --write-out '\n%{http_code}' "$url"); then
        say "cannot ask the Kubernetes API for spec.replicas ($url); removing nothing"
        exit 1
    fi
    code=${answer##*"$nl"}
    body=${answer%"$nl"*}
    case $code in
        200) ;;
        404)
            say "statefulset $set_name is gone: not a scale-down; removing nothing"
            exit 0
            ;;
        *)
            say "the Kubernetes API answered $code for $url; removing nothing: $body"
            exit 1
            ;;
    esac
    # A Scale: {"kind":"Scale",...,"spec":{"replicas":3},"status":{...}};
    # at zero replicas its spec is {} (omitempty).
    body=$(printf '%s' "$body" | tr -d ' \n\t\r')
    case $body in
        *'"spec":{}'*) replicas=0 ;;
        *) replicas=$(printf '%s\n' "$body" | sed -n 's/.*"spec":{"replicas":\([0-9][0-9]*\)}.*/\1/p') ;;
    esac
fi
case $replicas in
    '' | *[!0-9]*)
        say "cannot read spec.replicas of statefulset $set_name (got '$replicas'); removing nothing"
        exit 1
        ;;
esac

if [ "$replicas" -eq 0 ]; then
    say "statefulset $set_name is scaled to zero: a pause, not a shrink; node $id stays a member"
    exit 0
fi
if [ "$ordinal" -lt "$replicas" ]; then
    say "spec.replicas is $replicas: pod $pod comes back (a restart, not a scale-down);" \
        "node $id stays a member"
    exit 0
fi

endpoints=
n=0
while [ "$n" -lt "$replicas" ]; do
    endpoints="$endpoints${endpoints:+,}$set_name-$n.$domain:7101"
    n=$((n + 1))
done
set -- fencelock member remove "$id" \
    --endpoints "$endpoints" \
    --certs-dir "$certs_dir" \
    --user "$user" \
    --timeout 5s \
    --retry-for 30s
say "spec.replicas is $replicas: scale-down past pod $pod; removing node $id from the cluster"

if [ "$dry_run" = 1 ]; then
    say "dry run: would write $data_dir/fencelock-removed, then run the command below"
    printf '%s\n' "$@"
    exit 0
fi

marker="$data_dir/fencelock-removed"
printf 'node %s removed from the cluster by the preStop hook (spec.replicas %s) on %s\n' \
    "$id" "$replicas" "$(date -u '+%Y-%m-%dT%H:%M:%SZ')" >"$marker"
if "$@" >&2; then
    say "node $id removed"
    exit 0
fi
rm -f -- "$marker"
say "could not remove node $id: it stays a member; remove it by hand" \
    "(fencelock member remove $id) and delete its PersistentVolumeClaim"
exit 1
