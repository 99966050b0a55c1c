#!/bin/bash
# One query through psql against a `spindle serve` of a copy of a data
# directory (the figures bench/README.md quotes as "query-psql.sh"):
#
#   bench/scripts/query-psql.sh median BIN DATA_DIR QUERY_FILE N
#   bench/scripts/query-psql.sh cpu    BIN DATA_DIR QUERY_FILE N
#
# starts BIN (a spindle binary) on a fresh copy of DATA_DIR on port 55432
# and runs QUERY_FILE once to warm up (plan, page cache), then N times in
# one psql session. `median` prints the median of the N latencies in ms
# (psql's \timing); `cpu` prints the server process's user + system CPU
# time over the N runs divided by N, in ms (clock ticks of 10 ms: read it
# to about ±10 ms / N), which the VM's scheduling noise moves less.
set -euo pipefail
MODE=$1 BIN=$2 DATA=$3 SQL=$4 N=$5
RUN=$(mktemp -d)
cp -r "$DATA" "$RUN/data"
"$BIN" serve --data-dir "$RUN/data" --listen 127.0.0.1:55432 > "$RUN/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null; rm -rf "$RUN"' EXIT
for _ in $(seq 1 50); do
    psql -h 127.0.0.1 -p 55432 -U postgres -c "select 1" > /dev/null 2>&1 && break
    sleep 0.2
done
psql -h 127.0.0.1 -p 55432 -U postgres -f "$SQL" > /dev/null
runs() { for _ in $(seq 1 "$N"); do cat "$SQL"; done; }
case "$MODE" in
    median)
        ( echo '\timing on'; runs ) | psql -h 127.0.0.1 -p 55432 -U postgres 2>&1 \
            | grep '^Time' | awk '{print $2}' | sort -n \
            | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'
        ;;
    cpu)
        ticks() { awk '{print $14 + $15}' "/proc/$SERVER/stat"; }
        t0=$(ticks)
        runs | psql -h 127.0.0.1 -p 55432 -U postgres > /dev/null
        t1=$(ticks)
        echo "scale=1; ($t1 - $t0) * 1000 / $(getconf CLK_TCK) / $N" | bc
        ;;
    *) echo "mode must be median or cpu" >&2; exit 2 ;;
esac
