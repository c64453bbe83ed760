#!/usr/bin/env bash
# cluster.sh — a larder cluster on this machine, from local processes only (docs/deployment.md):
# one redis-server (unix socket, no persistence) as the shared remote KV tier, N `larder serve`
# replicas on loopback sharing it (--kv-remote), and HAProxy in front routing by session key
# (X-Session-Id header, else the OpenAI `user` / Anthropic metadata.user_id field, else the start
# of the prompt) with consistent hashing and health checks on /health.
#
#   scripts/cluster.sh start [--model PATH] [--replicas N] [--port PORT] [--dir DIR] [--no-remote]
#                            [--balance-factor F] [-- EXTRA SERVE FLAGS...]
#   scripts/cluster.sh stop   [--dir DIR]
#   scripts/cluster.sh status [--dir DIR]
#
# Everything lives in DIR (default $LARDER_CLUSTER_DIR, else ${TMPDIR:-/tmp}/larder-cluster-$UID):
# redis.sock, haproxy.cfg, one log per process, pids, and cluster.env (ROUTER_URL, REPLICA_URLS,
# REDIS_URL) for scripts and tests to read. The router listens on PORT (default 8800), replica i
# on PORT+i. `stop` ends exactly the processes it started (their pids) and removes DIR.
# --no-remote starts the replicas without the Redis tier (the baseline of bench/cluster_bench.py).
# --balance-factor: HAProxy's hash-balance-factor (default 150: no replica above 150 % of the
# average connections; 0 = plain consistent hashing, placement independent of timing).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
LARDER=${LARDER_BIN:-$ROOT/build/bin/larder}
DIR=${LARDER_CLUSTER_DIR:-${TMPDIR:-/tmp}/larder-cluster-$(id -u)}
MODEL=""
REPLICAS=3
PORT=8800
REMOTE=1
BALANCE=150
EXTRA=()

die() { echo "cluster.sh: $*" >&2; exit 1; }

cmd=${1:-}
[[ -n $cmd ]] || die "usage: cluster.sh start|stop|status [options] (see the header of this script)"
shift
while (($#)); do
  case $1 in
    --model) MODEL=$2; shift 2 ;;
    --replicas) REPLICAS=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    --no-remote) REMOTE=0; shift ;;
    --balance-factor) BALANCE=$2; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) die "unknown option '$1'" ;;
  esac
done

# Waits until URL/health answers 200 (the replica loaded its model), or the pid exits.
wait_healthy() {
  local url=$1 pid=$2 log=$3 i
  for ((i = 0; i < 1200; i++)); do
    kill -0 "$pid" 2>/dev/null || { tail -20 "$log" >&2; die "process $pid exited before $url/health was 200 (log: $log)"; }
    [[ $(curl -s -o /dev/null -w '%{http_code}' "$url/health" 2>/dev/null) == 200 ]] && return 0
    sleep 0.1
  done
  die "$url/health not 200 after 120 s (log: $log)"
}

stop_all() {
  [[ -f $DIR/pids ]] || return 0
  local pid
  # Reverse order: the router first (no new traffic), then the replicas (SIGTERM drains), Redis last.
  for pid in $(tac "$DIR/pids"); do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in $(tac "$DIR/pids"); do
    for ((i = 0; i < 300; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  rm -f "$DIR/pids"
}

case $cmd in
  start)
    [[ -x $LARDER ]] || die "no larder binary at $LARDER (scripts/build.sh, or set LARDER_BIN)"
    command -v haproxy >/dev/null || die "haproxy is not installed (apt-get install haproxy; scripts/setup.sh installs it)"
    ((REMOTE == 0)) || command -v redis-server >/dev/null || die "redis-server is not installed (scripts/setup.sh installs it)"
    [[ -n $MODEL ]] || MODEL=$ROOT/.cache/models/SmolLM2-135M-Instruct-hf
    [[ -e $MODEL ]] || die "model '$MODEL' not found (give --model PATH)"
    [[ $REPLICAS =~ ^[0-9]+$ ]] && ((REPLICAS >= 1)) || die "--replicas must be a positive integer"
    [[ $BALANCE =~ ^[0-9]+$ ]] && ((BALANCE == 0 || BALANCE > 100)) || die "--balance-factor must be 0 (off) or above 100"
    [[ -f $DIR/pids ]] && die "a cluster is already running in $DIR (cluster.sh stop --dir $DIR)"
    # A unix socket path holds at most 107 bytes (sun_path).
    ((${#DIR} + 11 <= 107)) || die "--dir '$DIR' is too long for a unix socket path inside it (at most 96 bytes)"
    mkdir -p "$DIR"
    DIR=$(cd "$DIR" && pwd)
    touch "$DIR/.larder-cluster"  # what `stop` checks before it removes DIR
    : > "$DIR/pids"
    trap 'stop_all' EXIT  # a failed start leaves nothing running
    remote_url=""
    if ((REMOTE)); then
      redis-server --port 0 --unixsocket "$DIR/redis.sock" --unixsocketperm 700 --save "" --appendonly no \
        --dir "$DIR" --logfile "$DIR/redis.log" --daemonize no < /dev/null > /dev/null 2>&1 &
      echo $! >> "$DIR/pids"
      for ((i = 0; i < 200; i++)); do [[ -S $DIR/redis.sock ]] && break; sleep 0.05; done
      [[ -S $DIR/redis.sock ]] || die "redis-server did not create $DIR/redis.sock (log: $DIR/redis.log)"
      remote_url="redis+unix://$DIR/redis.sock"
    fi
    urls=()
    for ((i = 1; i <= REPLICAS; i++)); do
      p=$((PORT + i))
      flags=(serve "$MODEL" --host 127.0.0.1 --port "$p")
      ((REMOTE)) && flags+=(--kv-remote "$remote_url")
      "$LARDER" "${flags[@]}" "${EXTRA[@]}" < /dev/null > "$DIR/replica$i.log" 2>&1 &
      echo $! >> "$DIR/pids"
      urls+=("http://127.0.0.1:$p")
    done
    i=0
    for pid in $(tail -n "$REPLICAS" "$DIR/pids"); do
      i=$((i + 1))
      wait_healthy "${urls[$((i - 1))]}" "$pid" "$DIR/replica$i.log"
    done
    {
      cat <<EOF
# Written by scripts/cluster.sh (docs/deployment.md). One router, $REPLICAS replicas.
global
  log stderr format raw local0
  # Large enough to hold a request body whole: the routing key is read from it (a longer body
  # still passes, keyed by what fits; the prompt-prefix key reads only its start).
  tune.bufsize 131072

defaults
  mode http
  log global
  log-format "%ci %HM %HU %ST %b/%s key=%[var(txn.key),xxh64] %Tw/%Tc/%Tr/%Tt"
  timeout connect 1s
  timeout client 600s
  timeout server 600s
  # A replica that refuses the connection or dies before answering (a killed process): the
  # request is sent again, to another replica (redispatch), which resumes from the shared tier.
  retries 2
  option redispatch 1
  retry-on conn-failure empty-response

frontend larder
  bind 127.0.0.1:$PORT
  option http-buffer-request
  # The routing key, first that exists: the session header, the client's user id (OpenAI user,
  # Anthropic metadata.user_id), then the first 1 KiB of the prompt — the system prompt of a
  # chat, the text of a completion — so requests sharing a prefix meet where it is cached.
  http-request set-var(txn.key) req.hdr(x-session-id) if { req.hdr(x-session-id) -m len gt 0 }
  http-request set-var(txn.key) req.body,json_query('\$.user') if !{ var(txn.key) -m found }
  http-request set-var(txn.key) req.body,json_query('\$.metadata.user_id') if !{ var(txn.key) -m found }
  http-request set-var(txn.key) req.body,json_query('\$.system'),bytes(0,1024) if !{ var(txn.key) -m found }
  http-request set-var(txn.key) req.body,json_query('\$.messages[0].content'),bytes(0,1024) if !{ var(txn.key) -m found }
  http-request set-var(txn.key) req.body,json_query('\$.prompt'),bytes(0,1024) if !{ var(txn.key) -m found }
  default_backend replicas

backend replicas
  # Consistent hashing: a key keeps its replica while the set is unchanged, and a replica that
  # goes down moves only its own keys. hash-balance-factor (cluster.sh --balance-factor, default
  # 150) bounds any replica's connections at that % of the average (consistent hashing with
  # bounded loads): one hot key cannot pile up; the overflow goes to the next replica on the ring.
  balance hash var(txn.key)
  hash-type consistent
EOF
      ((BALANCE > 0)) && echo "  hash-balance-factor $BALANCE"
      cat <<EOF
  option httpchk GET /health
  http-check expect status 200
  # A killed replica refuses the check's connection at once; a busy one may answer slowly, so a
  # check waits 2 s and three must fail before it is marked down (its sessions would move).
  timeout check 2s
  default-server check inter 500ms fall 3 rise 2
  http-response set-header X-Larder-Replica %[srv_name]
EOF
      for ((i = 1; i <= REPLICAS; i++)); do echo "  server replica$i 127.0.0.1:$((PORT + i))"; done
    } > "$DIR/haproxy.cfg"
    haproxy -c -q -f "$DIR/haproxy.cfg" || die "haproxy refused $DIR/haproxy.cfg"
    haproxy -db -f "$DIR/haproxy.cfg" < /dev/null > "$DIR/haproxy.log" 2>&1 &
    echo $! >> "$DIR/pids"
    hpid=$!
    for ((i = 0; i < 200; i++)); do
      kill -0 "$hpid" 2>/dev/null || die "haproxy exited (log: $DIR/haproxy.log)"
      [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health" 2>/dev/null) == 200 ]] && break
      sleep 0.05
    done
    {
      echo "ROUTER_URL=http://127.0.0.1:$PORT"
      echo "REPLICA_URLS=${urls[*]}"
      echo "REDIS_URL=$remote_url"
      echo "MODEL=$MODEL"
    } > "$DIR/cluster.env"
    trap - EXIT
    echo "cluster.sh: router http://127.0.0.1:$PORT -> ${urls[*]}${remote_url:+ (shared tier $remote_url)}; dir $DIR"
    ;;
  stop)
    [[ -d $DIR ]] || die "no cluster in $DIR"
    stop_all
    if [[ -f $DIR/.larder-cluster ]]; then
      rm -rf -- "$DIR"
      echo "cluster.sh: stopped; removed $DIR"
    else
      echo "cluster.sh: stopped; $DIR was not made by cluster.sh start, left in place"
    fi
    ;;
  status)
    [[ -f $DIR/cluster.env ]] || die "no cluster in $DIR"
    cat "$DIR/cluster.env"
    # shellcheck disable=SC1091
    . "$DIR/cluster.env"
    for u in $REPLICA_URLS; do echo "$u $(curl -s "$u/health")"; done
    ;;
  *) die "unknown command '$cmd' (start, stop, status)" ;;
esac
