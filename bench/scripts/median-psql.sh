#!/bin/bash
# Median latency of one query through psql against a `spindle serve` of a
# copy of a data directory (the figures bench/README.md quotes as
# "median-psql.sh"):
#
#   bench/scripts/median-psql.sh BIN DATA_DIR QUERY_FILE N
#
# starts BIN (a spindle binary) on a fresh copy of DATA_DIR on port 55432,
# runs QUERY_FILE N + 1 times in one psql session with \timing, and prints
# the median of the last N times in ms (the first run plans and warms up).
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
( echo '\timing on'; for _ in $(seq 0 "$N"); do cat "$SQL"; done ) \
    | psql -h 127.0.0.1 -p 55432 -U postgres 2>&1 \
    | grep '^Time' | tail -n "$N" | awk '{print $2}' | sort -n \
    | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'
