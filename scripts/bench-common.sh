# Sourced by the bench scripts: a work dir `$work` and the processes started for the run
# (`pids+=($!)`), stopped and removed on exit whatever the exit; `free_port`, a free loopback
# port; `need COMMAND PACKAGE...`, Debian's packages installed unless COMMAND is there;
# `mosquitto_peer_conf PORT`, the local path's peer: Mosquitto as the benchmarks run it.
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
need() {
  command -v "$1" > /dev/null && return
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${@:2}" >&2
}
mosquitto_peer_conf() {
  cat <<EOC
listener $1 127.0.0.1
allow_anonymous true
persistence false
set_tcp_nodelay true
max_inflight_messages 100
max_queued_messages 10000
log_dest none
EOC
}
