#!/bin/bash
# Server CPU time per query, in ms, through psql against a `spindle serve`
# of a copy of a data directory (the figures bench/README.md quotes as
# "cpu-psql.sh"): less sensitive than latency to the VM's scheduling noise.
#
#   bench/scripts/cpu-psql.sh BIN DATA_DIR QUERY_FILE N
#
# runs QUERY_FILE once to warm up, then N times in one psql session, and
# prints the server process's user + system CPU time over those N runs
# divided by N (clock ticks of 10 ms: read it to about ±10 ms / N).
set -euo pipefail
BIN=$1 DATA=$2 SQL=$3 N=$4
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
ticks() { awk '{print $14 + $15}' "/proc/$SERVER/stat"; }
t0=$(ticks)
for _ in $(seq 1 "$N"); do cat "$SQL"; done | psql -h 127.0.0.1 -p 55432 -U postgres > /dev/null
t1=$(ticks)
echo "scale=1; ($t1 - $t0) * 1000 / $(getconf CLK_TCK) / $N" | bc
