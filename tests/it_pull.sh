#!/usr/bin/env bash
# lily pull against a local fake hub (tests/fake_hub.py on 127.0.0.1, free ports): the
# happy path, re-pull, gated repo (401 / token, no token leak to the CDN), 404, 5xx
# retries, a connection cut mid-file (resumed in the same run and in a later run), a
# corrupted byte (sha256 mismatch), a file size limit and a full disk (tmpfs).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}; case $BUILD in /*) ;; *) BUILD=$PWD/$BUILD ;; esac
LILY=$BUILD/lily
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*"; }
check() { local what=$1; shift; if "$@"; then ok; else bad "$what"; fi; }

T=$(mktemp -d /tmp/lily-it-pull-XXXXXX)
hubpid=""
cleanup() { [ -n "$hubpid" ] && kill "$hubpid" 2>/dev/null; mountpoint -q "$T/full" 2>/dev/null && umount "$T/full"; rm -rf "$T"; }
trap cleanup EXIT

# The repository: the tiny fixture (LFS shards) plus a nested plain file.
mkdir -p "$T/repo/sub"
cp ../shared/fixtures/tiny/*.json ../shared/fixtures/tiny/model-*.safetensors "$T/repo/"
head -c 3000 /dev/urandom | base64 > "$T/repo/sub/notes.txt"
python3 tests/fake_hub.py "$T/repo" org/tiny "$T/ports" 2>"$T/hub.log" &
hubpid=$!
for _ in $(seq 50); do [ -s "$T/ports" ] && break; sleep 0.1; done
read -r HP CP < "$T/ports"
export HF_ENDPOINT=http://127.0.0.1:$HP LILY_HOME=$T/home LILY_PULL_RETRY_MS=20
unset HF_TOKEN HUGGING_FACE_HUB_TOKEN
ctl() { curl -s -X POST -d "$1" "http://127.0.0.1:$HP/_ctl" >/dev/null; }
log() { curl -s "http://127.0.0.1:$HP/_ctl/log" | tee "$T/last-log.json"; }
same_as_repo() { diff -r -x '.lily-pull*' "$T/repo" "$1" >/dev/null && [ -z "$(find "$1" -name '*.partial')" ]; }
big=model-00001-of-00005.safetensors
bigsize=$(stat -c %s "$T/repo/$big")

# 1. happy path into the cache folder
out=$($LILY pull org/tiny 2>"$T/err"); rc=$?
check "pull rc=$rc: $(tail -n 3 "$T/err")" [ $rc = 0 ]
check "prints the cache folder ($out)" [ "$out" = "$T/home/models/org--tiny" ]
check "all files identical" same_as_repo "$T/home/models/org--tiny"
check "LFS files came through the CDN" python3 -c "
import json,sys; l=json.load(sys.stdin); sys.exit(0 if any(e['port']==$CP for e in l) else 1)" <<<"$(log)"

# 2. again: nothing is downloaded
ctl '{"reset": true}'
$LILY pull org/tiny >/dev/null 2>&1
check "re-pull downloads nothing" python3 -c "
import json,sys; l=[e for e in json.load(sys.stdin) if not e['path'].startswith('/_ctl')]; sys.exit(0 if len(l)==1 and l[0]['path'].startswith('/api/') else 1)" <<<"$(log)"

# 3. gated: 401 without a token names HF_TOKEN and leaves nothing; with it, the
#    token reaches the hub but never the CDN (which would answer 400)
ctl '{"reset": true, "token": "s3cret"}'
$LILY pull org/tiny --dir "$T/gated" >/dev/null 2>"$T/err"; rc=$?
check "401 fails" [ $rc != 0 ]
check "401 message: $(cat "$T/err")" grep -q "HF_TOKEN" "$T/err"
check "401 leaves nothing" [ ! -e "$T/gated" ]
HF_TOKEN=wrong $LILY pull org/tiny --dir "$T/gated" >/dev/null 2>"$T/err"
check "wrong token fails: $(cat "$T/err")" grep -q "401" "$T/err"
ctl '{"reset": true, "token": "s3cret"}'
HF_TOKEN=s3cret $LILY pull org/tiny --dir "$T/gated" >/dev/null 2>"$T/err"; rc=$?
check "token pull rc=$rc: $(tail -n 2 "$T/err")" [ $rc = 0 ]
check "token pull files" same_as_repo "$T/gated"
check "token sent to the hub, never to the CDN" python3 -c "
import json,sys; l=json.load(sys.stdin)
hub=[e for e in l if e['port']==$HP and not e['path'].startswith('/_ctl')]; cdn=[e for e in l if e['port']==$CP]
sys.exit(0 if hub and cdn and all(e['auth'] for e in hub) and not any(e['auth'] for e in cdn) else 1)" <<<"$(log)"

# 4. 404: unknown repository and unknown revision
ctl '{"reset": true}'
$LILY pull org/nope --dir "$T/nope" >/dev/null 2>"$T/err"; rc=$?
check "404 repo: $(cat "$T/err")" [ $rc != 0 ] && grep -q "404" "$T/err"
check "404 leaves nothing" [ ! -e "$T/nope" ]
$LILY pull org/tiny --revision v9 --dir "$T/nope" >/dev/null 2>"$T/err"; rc=$?
check "404 revision: $(cat "$T/err")" [ $rc != 0 ] && grep -q "404" "$T/err"
$LILY pull ../etc --dir "$T/nope" >/dev/null 2>"$T/err"
check "bad repo id refused: $(cat "$T/err")" grep -q "not a repository id" "$T/err"

# 5. 503 twice, then fine (retried with backoff)
ctl "{\"reset\": true, \"fail\": {\"config.json\": 2}}"
$LILY pull org/tiny --dir "$T/retry" >/dev/null 2>"$T/err"; rc=$?
check "503 retried rc=$rc" [ $rc = 0 ]
check "retry notes printed" grep -q "retrying" "$T/err"
check "503 files" same_as_repo "$T/retry"

# 6. connection cut mid-file: resumed with a range request in the same run
cut=$((bigsize / 3))
ctl "{\"reset\": true, \"cut\": {\"$big\": $cut}}"
$LILY pull org/tiny --dir "$T/cut" >/dev/null 2>"$T/err"; rc=$?
check "cut resumed rc=$rc: $(tail -n 2 "$T/err")" [ $rc = 0 ]
check "cut files" same_as_repo "$T/cut"
check "resumed from byte $cut" python3 -c "
import json,sys; l=json.load(sys.stdin); sys.exit(0 if any(e['range']=='bytes=$cut-' for e in l) else 1)" <<<"$(log)"

# 7. cut, no retries: the run fails, keeps only name.partial; the next run resumes
ctl "{\"reset\": true, \"cut\": {\"$big\": $cut}}"
LILY_PULL_RETRIES=1 $LILY pull org/tiny --dir "$T/cut2" >/dev/null 2>"$T/err"; rc=$?
check "cut without retries fails" [ $rc != 0 ]
check "partial kept, final name absent" [ -f "$T/cut2/$big.partial" ] && [ ! -e "$T/cut2/$big" ]
check "partial holds the bytes received" [ "$(stat -c %s "$T/cut2/$big.partial" 2>/dev/null)" = $cut ]
ctl '{"reset": true}'
$LILY pull org/tiny --dir "$T/cut2" >/dev/null 2>"$T/err"; rc=$?
check "second run completes rc=$rc" [ $rc = 0 ]
check "second run resumed from byte $cut" python3 -c "
import json,sys; l=json.load(sys.stdin); sys.exit(0 if any(e['range']=='bytes=$cut-' for e in l) else 1)" <<<"$(log)"
check "cut2 files" same_as_repo "$T/cut2"

# 7b. killed after the last byte but before the rename: verified without downloading
ctl "{\"reset\": true, \"cut\": {\"$big\": $cut}}"
LILY_PULL_RETRIES=1 $LILY pull org/tiny --dir "$T/cut3" >/dev/null 2>&1
cp "$T/repo/$big" "$T/cut3/$big.partial"
ctl '{"reset": true}'
$LILY pull org/tiny --dir "$T/cut3" >/dev/null 2>"$T/err"; rc=$?
check "complete partial: rc=$rc $(tail -n 2 "$T/err")" [ $rc = 0 ]
check "complete partial: no request for it" python3 -c "
import json,sys; l=json.load(sys.stdin); sys.exit(0 if not any('$big' in e['path'] for e in l) else 1)" <<<"$(log)"
check "complete partial files" same_as_repo "$T/cut3"

# 8. a corrupted byte: sha256 mismatch, nothing kept under the final name (nor as .partial)
ctl "{\"reset\": true, \"corrupt\": [\"$big\"]}"
$LILY pull org/tiny --dir "$T/bad" >/dev/null 2>"$T/err"; rc=$?
check "corrupt fails" [ $rc != 0 ]
check "corrupt message: $(cat "$T/err")" grep -q "sha256 mismatch" "$T/err"
check "corrupt file not kept" [ ! -e "$T/bad/$big" ] && [ ! -e "$T/bad/$big.partial" ]
ctl '{"reset": true}'
$LILY pull org/tiny --dir "$T/bad" >/dev/null 2>&1
check "after the fault, a clean pull" same_as_repo "$T/bad"

# 9. a resumed partial that does not belong to the file any more is not trusted
printf 'garbage' > "$T/bad/x.partial"
head -c 1000 /dev/urandom > "$T/cut2/$big.partial"
rm "$T/cut2/$big"
$LILY pull org/tiny --dir "$T/cut2" >/dev/null 2>"$T/err"; rc=$?
check "stale partial without manifest entry refetched rc=$rc: $(cat "$T/err")" [ $rc = 0 ]
check "stale partial files" same_as_repo "$T/cut2"

# 10. file size limit mid-write: clear error, final name absent, next run resumes
(ulimit -f 2000; $LILY pull org/tiny --dir "$T/ulimit" >/dev/null 2>"$T/err"); rc=$?
check "size limit fails" [ $rc != 0 ]
check "size limit message: $(cat "$T/err")" grep -q "disk is full or the file size limit" "$T/err"
check "size limit: no truncated file under a final name" bash -c "
for f in \$(cd '$T/ulimit' && find . -type f ! -name '*.partial' ! -name '.lily-pull*'); do cmp -s '$T/ulimit/'\$f '$T/repo/'\$f || exit 1; done"
$LILY pull org/tiny --dir "$T/ulimit" >/dev/null 2>&1
check "size limit: next run completes" same_as_repo "$T/ulimit"

# 11. full disk: a 4 MB tmpfs cannot hold 13 MB; refused before downloading
mkdir -p "$T/full"
if mount -t tmpfs -o size=4m tmpfs "$T/full" 2>/dev/null; then
  ctl '{"reset": true}'
  $LILY pull org/tiny --dir "$T/full/m" >/dev/null 2>"$T/err"; rc=$?
  check "full disk refused: $(cat "$T/err")" [ $rc != 0 ] && grep -q "not enough disk space" "$T/err"
  check "full disk: nothing downloaded" python3 -c "
import json,sys; l=json.load(sys.stdin); sys.exit(0 if not any('/resolve/' in e['path'] for e in l) else 1)" <<<"$(log)"
  umount "$T/full"
else
  echo "note: cannot mount a tmpfs (not root?): the statvfs refusal is covered by test_hub only"
fi

echo "it_pull: $pass passed, $fail failed"
[ $fail = 0 ]
