#!/bin/bash
# Device side (issue 26): wait up to $1 seconds for tests/gpu/gpu_tier.py (started under setsid) to
# finish, then pack its results from $RES into $OUT (at most 8 files come back from the device).
RES=${RES:-/tmp/res}; END=$(( $(date +%s) + ${1:-560} ))
while [ "$(date +%s)" -lt "$END" ]; do
  grep -q '"outcome"' "$RES/results.json" 2>/dev/null && break
  sleep 5
done
tail -c 7000 "$RES/driver.log"
tar czf "$OUT/res.tgz" -C "$(dirname "$RES")" "$(basename "$RES")"
cp "$RES/results.json" "$RES/driver.log" "$OUT/" 2>/dev/null
ls -la "$OUT"
