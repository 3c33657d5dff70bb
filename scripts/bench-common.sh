# Sourced by the bench scripts: a work dir `$work` and the processes started for the run
# (`pids+=($!)`), stopped and removed on exit whatever the exit; `free_port`, a free loopback
# port.
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
