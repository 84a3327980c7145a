# Sourced by the bench/server_*.sh scripts: one lily-server at a time, started on a free port, asked over
# HTTP, stopped. curl runs without LD_LIBRARY_PATH: on the GPU machine that points at the libraries carried
# for lily (tests/cuda/pack_device.sh), which the system's curl must not load. SRV_BACKEND (default cuda)
# is the servers' --backend, so a script can be tried on the CPU with a small model first.
# T: a scratch folder, removed (and the server stopped) when the script exits
sp= port=
T=$(mktemp -d)
trap 'srv_stop; rm -rf "$T"' EXIT

# srv_start LOG [env VAR=value ...] SERVER ARGS...: starts it on a free port (its stderr in LOG), sets $sp and
# $port; exits with the log's last lines when it does not come up within three minutes
srv_start() {
  local log=$1 _
  shift
  : >"$log"
  "$@" --port 0 --backend "${SRV_BACKEND:-cuda}" 2>"$log" &
  sp=$!
  port=
  for _ in $(seq 900); do
    kill -0 "$sp" 2>/dev/null || break
    port=$(grep -ao 'http://127.0.0.1:[0-9]*' "$log" | sed 's/.*://')
    [ -n "$port" ] && return 0
    sleep 0.2
  done
  echo "server did not start: $(tail -3 "$log")"
  exit 1
}
srv_stop() { if [ -n "$sp" ]; then kill "$sp" 2>/dev/null; wait "$sp" 2>/dev/null; fi; sp=; }

# srv_post PATH JSON: the response body on stdout
srv_post() { env -u LD_LIBRARY_PATH curl -s "http://127.0.0.1:$port$1" -H 'Content-Type: application/json' -d "$2"; }
# srv_metrics REGEX: the /metrics lines that match
srv_metrics() { env -u LD_LIBRARY_PATH curl -s "http://127.0.0.1:$port/metrics" | grep -E "$1"; }
# srv_rate N TOKENS T0 T1 LABEL: one line, the aggregate rate of N requests' TOKENS between two `date +%s.%N`
srv_rate() { awk -v n="$1" -v t="$2" -v a="$3" -v b="$4" -v s="$5" 'BEGIN { printf "%s N=%d (%d tokens): %.3f s, %.1f tok/s aggregate\n", s, n, t, b - a, t / (b - a) }'; }
