#!/bin/bash
# The push check's cost (bench/LFS.md): one push of a synthetic repository
# (400 commits of 100 changed files, ~58k objects, 11k blobs under 1 KiB,
# no LFS pointer) over HTTP to a fresh packwire, with --lfs-require-objects
# on or off; prints the wall and the server's CPU (utime+stime+cutime+cstime
# ticks of 10 ms: receive-pack and the hook included).
#   bench/lfs/pushcheck.sh PACKWIRE true|false [REPO]
set -e
BIN=$1; REQ=$2; SRC=${3:-/tmp/pushcheck-src}
if [ ! -d "$SRC" ]; then
  git init -q "$SRC"
  python3 - <<'PY' | git -C "$SRC" fast-import --quiet
import random, sys
random.seed(7)
out = sys.stdout.buffer
words = [("w%d" % i).encode() for i in range(5000)]
mark = 0
for c in range(400):
    changes = []
    for i in range(100):
        mark += 1
        n = random.choice([300, 800, 2000, 4000, 8000, 3000, 5000])
        data = b" ".join(random.choice(words) for _ in range(n // 5))[:n] + b"\n"
        out.write(b"blob\nmark :%d\ndata %d\n" % (mark, len(data)) + data + b"\n")
        changes.append((b"src/d%d/f%d.c" % (random.randrange(50), random.randrange(4000)), mark))
    out.write(b"commit refs/heads/main\ncommitter x <x@x> %d +0000\ndata 4\nc%03d\n" % (1600000000 + c, c))
    for f, m in changes:
        out.write(b"M 100644 :%d %s\n" % (m, f))
    out.write(b"\n")
PY
fi
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
$BIN init --data "$D/data" >/dev/null
$BIN user add bench --data "$D/data" >/dev/null
$BIN repo create r --data "$D/data" >/dev/null
$BIN grant bench write r --data "$D/data" >/dev/null
TOK=$($BIN token create bench --data "$D/data" | tail -1)
PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
$BIN serve --data "$D/data" --http 127.0.0.1:$PORT --git "" --ssh "" --maintain-interval 0 --lfs-require-objects=$REQ >/dev/null 2>&1 &
SP=$!
for i in $(seq 1 100); do curl -s -o /dev/null http://127.0.0.1:$PORT/ && break; sleep 0.2; done
export HOME=$D GIT_CONFIG_NOSYSTEM=1
c0=$(awk '{print $14+$15+$16+$17}' /proc/$SP/stat)
s=$(date +%s.%N)
git -C "$SRC" push -q http://bench:$TOK@127.0.0.1:$PORT/r.git main
e=$(date +%s.%N)
sleep 1 # receive-pack reaped
c1=$(awk '{print $14+$15+$16+$17}' /proc/$SP/stat)
echo "require-objects=$REQ wall $(echo "$e - $s" | bc) s, server CPU $((c1 - c0)) ticks (10 ms), load $(cut -d' ' -f1 /proc/loadavg)"
kill $SP; wait $SP 2>/dev/null || true
