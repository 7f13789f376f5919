#!/usr/bin/env bash
# A single-node Ceph cluster with radosgw, for grove's object-store tests:
# one monitor, one manager, one BlueStore OSD on a sparse file, radosgw on
# 127.0.0.1 with one S3 user and one test bucket, and one RADOS pool for
# librados clients (grove-rados's tests), reached as client.admin. Everything (configuration,
# keys, data, logs, pid files) lives under one runtime directory,
# $GROVE_CEPH_DIR (default /var/tmp/grove-ceph); nothing goes to /etc/ceph or
# /var/lib/ceph, and every address is on the loopback.
#
#   scripts/ceph.sh start   installs Ceph if missing (Debian packages), deploys
#                           and starts it, waits for HEALTH_OK and radosgw, writes
#                           $GROVE_CEPH_DIR/env.sh and prints its exports.
#                           Already running: only prints them.
#   scripts/ceph.sh env     prints the exports of a running cluster:
#                           eval "$(scripts/ceph.sh env)" or . "$GROVE_CEPH_DIR/env.sh"
#   scripts/ceph.sh stop    stops the daemons and removes the runtime directory.
#
# env.sh exports AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
# AWS_REGION, GROVE_TEST_S3_BUCKET, CEPH_CONF (so `ceph`, `rados`,
# `radosgw-admin` and librados clients reach this cluster as client.admin:
# the conf names the keyring) and GROVE_TEST_RADOS_POOL.
#
# Two settings keep it fast: `paxos propose interval = 0.1` (each monitor
# change otherwise waits about 1 s; radosgw makes about ten at its first
# start) and `tcp_nodelay=1` in the rgw frontend (small GETs otherwise wait on
# Nagle and delayed ACKs, ~47 ms each). Facts: shared/notes/ceph-and-s3.md.
set -euo pipefail

DIR=${GROVE_CEPH_DIR:-/var/tmp/grove-ceph}
CONF=$DIR/ceph.conf
ENV_FILE=$DIR/env.sh
DAEMONS=(mon.a mgr.x osd.0 client.rgw.gw)
PACKAGES=(ceph-mon ceph-mgr ceph-osd radosgw ceph-common)
# Bounded waits, in tenths of a second.
HEALTH_WAIT_TENTHS=1200
STOP_WAIT_TENTHS=150

log() { echo "ceph.sh: $*" >&2; }
die() { echo "ceph.sh: error: $*" >&2; exit 1; }

install_missing() {
  local missing=()
  command -v ceph-mon >/dev/null 2>&1 || missing+=(ceph-mon)
  command -v ceph-mgr >/dev/null 2>&1 || missing+=(ceph-mgr)
  command -v ceph-osd >/dev/null 2>&1 || missing+=(ceph-osd)
  command -v radosgw >/dev/null 2>&1 || missing+=(radosgw)
  command -v ceph >/dev/null 2>&1 || missing+=(ceph-common)
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    die "Ceph is not installed (Debian packages: ${PACKAGES[*]}), and installing it needs root and apt-get"
  fi
  log "installing ${PACKAGES[*]} (about 45 s)"
  export DEBIAN_FRONTEND=noninteractive
  # Another install may hold the dpkg lock: wait for it rather than fail.
  if ! apt-get -o DPkg::Lock::Timeout=300 update -qq >/dev/null ||
     ! apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends \
       "${PACKAGES[@]}" >/dev/null; then
    die "apt-get could not install ${PACKAGES[*]}"
  fi
}

# Whether something listens on 127.0.0.1:PORT.
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# The first free port from $1 on, trying $2 ports.
free_port() {
  local port=$1 tries=$2
  while [ "$tries" -gt 0 ]; do
    port_in_use "$port" || { echo "$port"; return 0; }
    port=$((port + 1)); tries=$((tries - 1))
  done
  return 1
}

# A process that is gone or a zombie counts as stopped: the daemons
# double-fork, and a slow init leaves them zombies for a while.
alive() {
  local pid=$1 state
  [ -r "/proc/$pid/stat" ] || return 1
  state=$(sed 's/^.*) //' "/proc/$pid/stat" | cut -d' ' -f1)
  [ "$state" != Z ]
}

daemon_pid() { cat "$DIR/run/$1.pid" 2>/dev/null || true; }

all_alive() {
  local d pid
  for d in "${DAEMONS[@]}"; do
    pid=$(daemon_pid "$d")
    [ -n "$pid" ] && alive "$pid" || return 1
  done
}

endpoint_of() { sed -n 's/^export AWS_ENDPOINT_URL=//p' "$ENV_FILE"; }

rgw_answers() { curl -s -o /dev/null --max-time 2 "$1/"; }

print_env() {
  [ -f "$ENV_FILE" ] || die "no cluster is running under $DIR (scripts/ceph.sh start)"
  cat "$ENV_FILE"
}

stop() {
  local d pid waited=0 left
  for d in "${DAEMONS[@]}"; do
    pid=$(daemon_pid "$d")
    # Everything under $DIR is thrown away: no need for a clean shutdown.
    [ -n "$pid" ] && alive "$pid" && kill -KILL "$pid" 2>/dev/null || true
  done
  while :; do
    left=()
    for d in "${DAEMONS[@]}"; do
      pid=$(daemon_pid "$d")
      [ -n "$pid" ] && alive "$pid" && left+=("$pid")
    done
    [ ${#left[@]} -eq 0 ] && break
    if [ $waited -ge $STOP_WAIT_TENTHS ]; then
      die "processes ${left[*]} still alive $((STOP_WAIT_TENTHS / 10)) s after SIGKILL; $DIR kept"
    fi
    sleep 0.1; waited=$((waited + 1))
  done
  rm -rf "$DIR"
}

# Waits until "$@" succeeds, at most $HEALTH_WAIT_TENTHS tenths of a second;
# on timeout names what it waited for ($WHAT) and the logs.
wait_for() {
  local what=$1 tenths=0; shift
  until "$@" >/dev/null 2>&1; do
    if [ $tenths -ge $HEALTH_WAIT_TENTHS ]; then
      ceph health detail 2>&1 | head -20 >&2 || true
      die "timed out after $((HEALTH_WAIT_TENTHS / 10)) s waiting for $what (logs in $DIR/log)"
    fi
    sleep 0.1; tenths=$((tenths + 1))
  done
}

health_ok() { [ "$(timeout 10 ceph health 2>/dev/null)" = HEALTH_OK ]; }

start() {
  install_missing
  export CEPH_CONF=$CONF
  if [ -f "$ENV_FILE" ] && all_alive && rgw_answers "$(endpoint_of)"; then
    print_env
    return 0
  fi
  [ -e "$DIR" ] && { log "cleaning up a stopped or broken cluster under $DIR"; stop; }

  local mon_port rgw_port fsid osd_uuid access secret bucket=grove-test endpoint rados_pool=grove-test
  mon_port=$(free_port 3300 50) || die "no free port for the monitor in 3300-3349"
  rgw_port=$(free_port 7480 50) || die "no free port for radosgw in 7480-7529"
  fsid=$(uuidgen); osd_uuid=$(uuidgen)
  access=$(head -c 10 /dev/urandom | od -An -tx1 | tr -d ' \n' | tr a-f A-F)
  secret=$(head -c 20 /dev/urandom | od -An -tx1 | tr -d ' \n')
  endpoint=http://127.0.0.1:$rgw_port
  mkdir -p "$DIR"/{run,log,mon/ceph-a,mgr/ceph-x,osd/ceph-0,rgw/ceph-gw}
  log "deploying under $DIR: monitor on 127.0.0.1:$mon_port, radosgw on $endpoint"

  cat >"$CONF" <<EOF
[global]
fsid = $fsid
mon initial members = a
mon host = v2:127.0.0.1:$mon_port
public network = 127.0.0.0/8
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
auth allow insecure global id reclaim = false
keyring = $DIR/keyring
run dir = $DIR/run
pid file = $DIR/run/\$name.pid
admin socket = $DIR/run/\$name.asok
log file = $DIR/log/\$name.log
mon data = $DIR/mon/\$cluster-\$id
mgr data = $DIR/mgr/\$cluster-\$id
osd data = $DIR/osd/\$cluster-\$id
# One OSD: one copy, placement over OSDs rather than hosts, few PGs.
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon warn on pool no redundancy = false
# A test host's disk may be fuller than the monitor's 30 % warning.
mon data avail warn = 2
mon data avail crit = 1
# Each monitor change would otherwise wait about 1 s.
paxos propose interval = 0.1

[osd]
osd objectstore = bluestore
# BlueStore directly on a sparse file (no loop device, no root needed).
bluestore block path = $DIR/osd/block.img
bluestore block create = true
bluestore block size = 10737418240
bluestore block db create = false
bluestore block wal create = false
osd memory target = 1073741824

[client.rgw.gw]
rgw data = $DIR/rgw/ceph-gw
rgw frontends = beast endpoint=127.0.0.1:$rgw_port tcp_nodelay=1
rgw dns name = 127.0.0.1
EOF

  # Every key goes into the monitor's initial keyring, so no `ceph auth`
  # round trip is needed later.
  ceph-authtool "$DIR/mon.keyring" --create-keyring --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-authtool "$DIR/keyring" --create-keyring --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mds 'allow *' --cap mgr 'allow *' >/dev/null
  ceph-authtool "$DIR/mgr/ceph-x/keyring" --create-keyring --gen-key -n mgr.x \
    --cap mon 'allow profile mgr' --cap osd 'allow *' --cap mds 'allow *' >/dev/null
  ceph-authtool "$DIR/osd/ceph-0/keyring" --create-keyring --gen-key -n osd.0 \
    --cap mon 'allow profile osd' --cap mgr 'allow profile osd' --cap osd 'allow *' >/dev/null
  ceph-authtool "$DIR/rgw/ceph-gw/keyring" --create-keyring --gen-key -n client.rgw.gw \
    --cap mon 'allow rw' --cap osd 'allow rwx' --cap mgr 'allow rw' >/dev/null
  local k
  for k in "$DIR/keyring" "$DIR/mgr/ceph-x/keyring" "$DIR/osd/ceph-0/keyring" "$DIR/rgw/ceph-gw/keyring"; do
    ceph-authtool "$DIR/mon.keyring" --import-keyring "$k" >/dev/null
  done
  monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$mon_port]" "$DIR/monmap" >/dev/null

  ceph-mon -c "$CONF" --mkfs -i a --monmap "$DIR/monmap" --keyring "$DIR/mon.keyring"
  ceph-mon -c "$CONF" -i a 2>>"$DIR/log/daemons.err"
  ceph-mgr -c "$CONF" -i x --keyring "$DIR/mgr/ceph-x/keyring" 2>>"$DIR/log/daemons.err"
  # The OSD's mkfs needs no monitor; registering it does.
  ceph-osd -c "$CONF" -i 0 --mkfs --osd-uuid "$osd_uuid" --keyring "$DIR/osd/ceph-0/keyring" \
    >"$DIR/log/osd-mkfs.out" 2>&1 || die "ceph-osd --mkfs failed: $(tail -3 "$DIR/log/osd-mkfs.out")"
  timeout 60 ceph osd new "$osd_uuid" 0 >/dev/null || die "the monitor did not register the OSD (logs in $DIR/log)"
  ceph-osd -c "$CONF" -i 0 --keyring "$DIR/osd/ceph-0/keyring" 2>>"$DIR/log/daemons.err"
  radosgw -c "$CONF" -n client.rgw.gw --keyring "$DIR/rgw/ceph-gw/keyring" 2>>"$DIR/log/daemons.err"
  # The RADOS pool is made while radosgw starts, so it costs no start time.
  # Eight PGs (the conf's default) are plenty for one OSD.
  timeout 60 ceph osd pool create "$rados_pool" 8 8 >/dev/null 2>&1 ||
    die "creating the RADOS pool $rados_pool failed (logs in $DIR/log)"
  timeout 60 ceph osd pool application enable "$rados_pool" rados >/dev/null 2>&1 ||
    die "tagging the RADOS pool $rados_pool failed (logs in $DIR/log)"

  wait_for "radosgw to answer on $endpoint" rgw_answers "$endpoint"
  radosgw-admin -c "$CONF" user create --uid=grove --display-name=grove \
    --access-key="$access" --secret-key="$secret" >/dev/null
  # The bucket, through S3 itself (curl signs with SigV4).
  local code
  # curl 7.88 signs without x-amz-content-sha256, which radosgw requires.
  code=$(curl -s -o "$DIR/log/bucket-create.out" -w '%{http_code}' -X PUT \
    -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' --aws-sigv4 "aws:amz:us-east-1:s3" --user "$access:$secret" "$endpoint/$bucket")
  [ "$code" = 200 ] || die "creating bucket $bucket answered HTTP $code: $(cat "$DIR/log/bucket-create.out")"
  wait_for HEALTH_OK health_ok

  cat >"$ENV_FILE" <<EOF
export AWS_ENDPOINT_URL=$endpoint
export AWS_ACCESS_KEY_ID=$access
export AWS_SECRET_ACCESS_KEY=$secret
export AWS_REGION=us-east-1
export GROVE_TEST_S3_BUCKET=$bucket
export CEPH_CONF=$CONF
export GROVE_TEST_RADOS_POOL=$rados_pool
EOF
  log "ready: . $ENV_FILE"
  print_env
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  env) print_env ;;
  *) echo "usage: scripts/ceph.sh start|stop|env   (runtime directory: \$GROVE_CEPH_DIR, default /var/tmp/grove-ceph)" >&2; exit 2 ;;
esac
