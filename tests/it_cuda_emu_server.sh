#!/usr/bin/env bash
# lily-server on the CUDA backend, run on the CPU emulator of the CUDA sources (docs/cuda.md):
# the GPU serving path (sessions on the device, batched rounds, streaming, parking a
# conversation to host memory and restoring it) end to end, without a GPU. Greedy answers
# must not depend on whether a conversation was parked, nor on streaming, nor on other
# streams decoding beside them (batched rounds).
cd "$(dirname "$0")/.." && . tests/lib.sh
E=$B/emu
if ! MAKEFLAGS= make -s -j2 EMU=1 BUILD="$E" "$E/lily-server" "$E/lily" >"$T/build.log" 2>&1; then
  tail -n 30 "$T/build.log"; bad "emulated build of lily-server"; it_done; exit 1
fi
"$B/lily" synth --out "$T/m" --preset tiny --vocab 2048 >/dev/null 2>&1
eserve() { # the emulated server: like serve (tests/lib.sh) with the emulated binary
  [ -n "$sp" ] && { kill $sp 2>/dev/null; wait $sp 2>/dev/null; }
  "$E/lily-server" --model-path "$T/m" --port 0 --threads 2 --backend cuda --slots "${SLOTS:-1}" --cache-mb 64 "$@" 2>"$T/err" &
  sp=$!
  port=
  for _ in $(seq 600); do port=$(grep -o 'http://127.0.0.1:[0-9]*' "$T/err" | sed 's/.*://'); [ -n "$port" ] && break; sleep 0.1; done
  [ -n "$port" ] || bad "emulated server did not start: $(cat "$T/err")"
}
chat() { curl -s "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' -d "{\"messages\":$1,\"max_tokens\":6,\"temperature\":0,\"chat_template_kwargs\":{\"enable_thinking\":false}${2:-}}"; }
content() { python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])'; }
metric() { curl -s "http://127.0.0.1:$port/metrics" | awk -v k="$1" '$1==k {print $2}'; }
A='[{"role":"system","content":"Answer briefly."},{"role":"user","content":"Name three rivers of Europe and the seas they reach."}]'
Bm='[{"role":"user","content":"Something else: count to three."}]'
follow() { python3 -c 'import json,sys; a=json.loads(sys.argv[1]); a.append({"role":"assistant","content":sys.argv[2]}); a.append({"role":"user","content":"And in Asia?"}); print(json.dumps(a))' "$A" "$1"; }

eserve
grep -q "cuda backend" "$T/err" && ok "emulated server on the cuda backend" || bad "backend: $(head -3 "$T/err")"
a1=$(chat "$A" | content)
s1=$(curl -sN "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' -d "{\"messages\":$A,\"max_tokens\":6,\"temperature\":0,\"stream\":true,\"chat_template_kwargs\":{\"enable_thinking\":false}}" |
  sed -n 's/^data: //p' | grep -v '^\[DONE\]' | python3 -c '
import json,sys
print("".join((json.loads(l)["choices"][0]["delta"].get("content") or "") for l in sys.stdin if json.loads(l)["choices"]))')
[ -n "$a1" ] && [ "$a1" = "$s1" ] && ok "greedy answer, streamed the same" || bad "stream '$s1' vs '$a1'"
chat "$Bm" >/dev/null
r=$(chat "$(follow "$a1")")
x=$(echo "$r" | content)
cached=$(echo "$r" | python3 -c 'import json,sys; print(json.load(sys.stdin)["usage"]["prompt_tokens_details"]["cached_tokens"])')
[ "$(metric lily_parked_total)" -ge 1 ] && [ "$(metric lily_unparked_total)" = 1 ] && [ "$cached" -gt 20 ] &&
  ok "conversation parked from the device and restored ($cached cached tokens)" || bad "park/unpark: cached $cached, $(metric lily_parked_total)/$(metric lily_unparked_total)"
eserve
a1b=$(chat "$A" | content)
y=$(chat "$(follow "$a1b")" | content)
[ "$a1" = "$a1b" ] && [ "$x" = "$y" ] && ok "the restored conversation answers as one that never left the GPU" || bad "'$x' vs '$y'"

# concurrent streams: the scheduler feeds every active slot's token in one lily_decode_batch
# (on the GPU one batched pass, src/cuda/cu_batch.cu); greedy texts must be those of the same
# requests one at a time
SLOTS=3 eserve
U=('[{"role":"user","content":"Tell me about the moon."}]'
   '[{"role":"user","content":"Write a short poem about rain falling on a quiet town at night, please."}]'
   '[{"role":"system","content":"Be terse."},{"role":"user","content":"What is seven times six?"}]')
seq1=()
for i in 0 1 2; do seq1+=("$(chat "${U[$i]}" | content)"); done
SLOTS=3 eserve # fresh sessions, so no prompt is served from another's cache
pids=
for i in 0 1 2; do chat "${U[$i]}" | content >"$T/conc$i" & pids="$pids $!"; done
wait $pids
same=1
for i in 0 1 2; do [ -n "${seq1[$i]}" ] && [ "$(cat "$T/conc$i")" = "${seq1[$i]}" ] || { same=0; echo "stream $i: '$(cat "$T/conc$i")' vs '${seq1[$i]}'"; }; done
[ $same = 1 ] && ok "three concurrent greedy streams give the texts of one at a time" || bad "concurrent streams differ from one at a time"
it_done
