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
eserve() { # the emulated server: like serve (tests/lib.sh) with the emulated binary; its warm-up (2 s
  # emulated) only where WARM=1 asks for it
  [ -n "$sp" ] && { kill $sp 2>/dev/null; wait $sp 2>/dev/null; }
  LILY_SRV_WARMUP=${WARM:-0} "$E/lily-server" --model-path "$T/m" --port 0 --threads 2 --backend cuda --slots "${SLOTS:-1}" --cache-mb 64 "$@" 2>"$T/err" &
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

WARM=1 eserve # (the warm-up's sessions reset: the answers below must not see them)
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
[ "$(metric lily_parked_gpu_bytes)" -gt 0 ] && [ "$(metric lily_parked_bytes)" = 0 ] &&
  ok "parked in GPU memory by default (--gpu-cache-mb)" || bad "tiers: gpu $(metric lily_parked_gpu_bytes), host $(metric lily_parked_bytes)"
eserve
a1b=$(chat "$A" | content)
y=$(chat "$(follow "$a1b")" | content)
[ "$a1" = "$a1b" ] && [ "$x" = "$y" ] && ok "the restored conversation answers as one that never left the GPU" || bad "'$x' vs '$y'"
# the host tier alone (--gpu-cache-mb 0), and a GPU tier with room for one conversation (a tiny
# one parks ~3.3 MB), whose oldest moves to the host to make room: A comes back from the host
# and answers as before
Cm='[{"role":"user","content":"A third thing: name a color."}]'
for cfg in "--gpu-cache-mb 0" "--gpu-cache-mb 5"; do
  eserve $cfg
  chat "$A" >/dev/null; chat "$Bm" >/dev/null; chat "$Cm" >/dev/null
  z=$(chat "$(follow "$a1")" | content)
  h=$(metric lily_parked_bytes); g=$(metric lily_parked_gpu_bytes)
  if [ "$cfg" = "--gpu-cache-mb 0" ]; then tiers=$([ "$g" = 0 ] && [ "$h" -gt 0 ] && echo ok); else tiers=$([ "$g" -gt 0 ] && [ "$h" -gt 0 ] && echo ok); fi
  [ "$z" = "$x" ] && [ "$(metric lily_unparked_total)" = 1 ] && [ "$tiers" = ok ] &&
    ok "$cfg: the conversation restored from the host answers the same (host $h, GPU $g bytes parked)" ||
    bad "$cfg: '$z' vs '$x', unparked $(metric lily_unparked_total), host $h, GPU $g"
done

# concurrent streams: the scheduler feeds every active slot's token in one lily_decode_batch
# (on the GPU one batched pass, src/cuda/cu_batch.cu); greedy texts must be those of the same
# requests one at a time
SLOTS=3 eserve
U=('[{"role":"user","content":"Tell me about the moon."}]'
   '[{"role":"user","content":"Write a short poem about rain falling on a quiet town at night, please."}]'
   '[{"role":"system","content":"Be terse."},{"role":"user","content":"What is seven times six?"}]')
seq1=()
for i in 0 1 2; do seq1+=("$(chat "${U[$i]}" | content)"); done
SLOTS=3 WARM=1 eserve # fresh sessions, so no prompt is served from another's cache (warmed up: a decode batch made and reset)
pids=
for i in 0 1 2; do chat "${U[$i]}" | content >"$T/conc$i" & pids="$pids $!"; done
wait $pids
same=1
for i in 0 1 2; do [ -n "${seq1[$i]}" ] && [ "$(cat "$T/conc$i")" = "${seq1[$i]}" ] || { same=0; echo "stream $i: '$(cat "$T/conc$i")' vs '${seq1[$i]}'"; }; done
[ $same = 1 ] && ok "three concurrent greedy streams give the texts of one at a time" || bad "concurrent streams differ from one at a time"
# the lone stream's device loop (src/server/sched.c burst): a job generating alone is handed to
# the GPU's decode loop, its tokens chosen and fed there with the job's own rng and counts. Its
# answers must be those of the rounds (LILY_SRV_DEVICE_LOOP=0, a host draw a token), for greedy
# and for seeded sampling with every penalty, logit bias and logprobs, and across a hand-over
# both ways (a second job arriving mid-burst, the rounds batching both, the burst resuming).
S='"temperature":0.9,"top_k":40,"top_p":0.95,"min_p":0.01,"seed":7,"presence_penalty":0.4,"frequency_penalty":0.3,"repetition_penalty":1.15,"logit_bias":{"17":2.5},"logprobs":true,"top_logprobs":3,"ignore_eos":true'
gen() { # gen MESSAGES MAX_TOKENS EXTRA: the answer's text and its tokens' logprobs, one line
  curl -s "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
    -d "{\"messages\":$1,\"max_tokens\":$2,\"chat_template_kwargs\":{\"enable_thinking\":false},$3}" |
    python3 -c 'import json,sys; c=json.load(sys.stdin)["choices"][0]; lp=c.get("logprobs") or {}
print(json.dumps([c["message"]["content"], c["finish_reason"], [[t["token"], round(t["logprob"], 4), [a["token"] for a in t["top_logprobs"]]] for t in (lp.get("content") or [])]]))'
}
LONG='[{"role":"user","content":"Tell me a long story about a lighthouse keeper."}]'
# (A stream's logits beside others' are within ~1e-5 of its logits alone, the fp16 cache's rounding:
# docs/cuda.md; so its logprobs are compared to 1e-3, the tokens, top lists and texts exactly.)
near() { python3 -c 'import json,sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
ok = a[:2] == b[:2] and len(a[2]) == len(b[2]) and all(x[0] == y[0] and x[2] == y[2] and abs(x[1] - y[1]) <= 1e-3 for x, y in zip(a[2], b[2]))
sys.exit(0 if ok else 1)' "$1" "$2" 2>/dev/null; }
declare -A ref
for mode in 0 1; do
  LILY_SRV_DEVICE_LOOP=$mode eserve
  ref[$mode,g]=$(gen "$LONG" 24 '"temperature":0,"ignore_eos":true')
  ref[$mode,s]=$(gen "$LONG" 24 "$S")
  ref[$mode,stop]=$(gen "$A" 24 '"temperature":0.7,"seed":3,"stop":["e"]')
  ref[$mode,runs]=$(metric lily_device_loop_runs_total)
  ref[$mode,toks]=$(metric lily_device_loop_tokens_total)
done
[ "${ref[0,toks]}" = 0 ] && [ "${ref[1,toks]}" -ge 40 ] && ok "the device loop ran (${ref[1,runs]} runs, ${ref[1,toks]} tokens; none when off)" ||
  bad "device loop metrics: on ${ref[1,runs]}/${ref[1,toks]}, off ${ref[0,runs]}/${ref[0,toks]}"
for k in g s stop; do
  [ -n "${ref[0,$k]}" ] && [ "${ref[0,$k]}" = "${ref[1,$k]}" ] && ok "device loop = rounds ($k): $(echo "${ref[1,$k]}" | cut -c1-60)" ||
    bad "device loop ($k): '${ref[1,$k]}' vs rounds '${ref[0,$k]}'"
done
# hand-over: a long sampled job, then two more while it decodes alone in the device loop; every
# answer must be what it is alone (the first one's rng and counts carried out of the burst into the
# batched rounds and back)
SLOTS=3 LILY_SRV_DEVICE_LOOP=1 eserve
gen "$LONG" 60 "$S" >"$T/h0" &
h0=$!
for _ in $(seq 200); do [ "$(metric lily_device_loop_runs_total)" -ge 1 ] && break; sleep 0.05; done
gen "$A" 8 '"temperature":0.8,"seed":11' >"$T/h1" & h1=$!
gen "$Bm" 8 "$S" >"$T/h2" & h2=$!
wait $h0 $h1 $h2
runs=$(metric lily_device_loop_runs_total)
SLOTS=3 LILY_SRV_DEVICE_LOOP=0 eserve
r0=$(gen "$LONG" 60 "$S"); r1=$(gen "$A" 8 '"temperature":0.8,"seed":11'); r2=$(gen "$Bm" 8 "$S")
near "$(cat "$T/h0")" "$r0" && near "$(cat "$T/h1")" "$r1" && near "$(cat "$T/h2")" "$r2" && [ "$runs" -ge 2 ] &&
  ok "a burst handed over to the rounds and back gives each job's answer alone ($runs runs)" ||
  bad "hand-over ($runs runs): '$(cut -c1-80 "$T/h0")' vs '$(echo "$r0" | cut -c1-80)'; '$(cat "$T/h1")' vs '$r1'; '$(cat "$T/h2")' vs '$r2'"
# the streams' device loop (src/server/sched.c batch_burst): jobs generating together decode in one
# batched loop on the GPU, each row's token chosen there with its own job's rng, counts and prompt
# mask. The lone stream's loop is off here (LILY_SRV_DEVICE_LOOP=0), so every token the device chose
# came from the batched loop. Three concurrent jobs that end at different steps (greedy, sampled with
# every option and logprobs, sampled with a stop string) must each give its answer alone, in rounds.
B2='"temperature":0.7,"seed":5,"logprobs":true,"top_logprobs":2,"stop":["o"]'
SLOTS=3 LILY_SRV_DEVICE_LOOP=0 LILY_SRV_BATCH_LOOP=0 eserve
q0=$(gen "$LONG" 30 "$S"); q1=$(gen "$A" 12 '"temperature":0,"ignore_eos":true'); q2=$(gen "$Bm" 20 "$B2")
SLOTS=3 LILY_SRV_DEVICE_LOOP=0 eserve
gen "$LONG" 30 "$S" >"$T/b0" & b0=$!
gen "$A" 12 '"temperature":0,"ignore_eos":true' >"$T/b1" & b1=$!
gen "$Bm" 20 "$B2" >"$T/b2" & b2=$!
wait $b0 $b1 $b2
bt=$(metric lily_device_loop_tokens_total); br=$(metric lily_device_loop_runs_total)
near "$(cat "$T/b0")" "$q0" && near "$(cat "$T/b1")" "$q1" && near "$(cat "$T/b2")" "$q2" && [ "$bt" -ge 10 ] &&
  ok "three streams in the batched device loop ($br runs, $bt tokens) give each one's answer alone" ||
  bad "batched loop ($br runs, $bt tokens): '$(cut -c1-80 "$T/b0")' vs '$(echo "$q0" | cut -c1-80)'; '$(cat "$T/b1")' vs '$q1'; '$(cat "$T/b2")' vs '$q2'"
# a client that disconnects while its stream is in the batched loop: its job is cancelled, the other
# goes on (in the rounds, then in a loop again if it were joined) and answers as alone
before=$(metric lily_requests_cancelled_total); r0=$(metric lily_device_loop_runs_total)
curl -s -N "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "{\"messages\":$LONG,\"max_tokens\":2000,\"temperature\":0,\"ignore_eos\":true,\"stream\":true}" >"$T/cut2" 2>/dev/null &
cp=$!
gen "$LONG" 30 "$S" >"$T/b3" & b3=$!
for _ in $(seq 300); do [ "$(metric lily_device_loop_runs_total)" -gt "$r0" ] && break; sleep 0.05; done
sleep 0.3
kill $cp 2>/dev/null; wait $cp 2>/dev/null
wait $b3
running=1
for _ in $(seq 100); do running=$(curl -s "http://127.0.0.1:$port/metrics" | awk '$1=="lily_requests_running" {print $2}'); [ "$running" = 0 ] && break; sleep 0.1; done
grep -q '^data: {' "$T/cut2" && [ "$running" = 0 ] && [ "$(metric lily_requests_cancelled_total)" -ge $((before + 1)) ] &&
  near "$(cat "$T/b3")" "$q0" && ok "a disconnect in the batched loop cancels that job; the other answers as alone" ||
  bad "disconnect in the batched loop: running $running, cancelled $before -> $(metric lily_requests_cancelled_total), '$(cut -c1-80 "$T/b3")' vs '$(echo "$q0" | cut -c1-80)'"
# a job with tools: its grammar starts at <tool_call> (a bias makes the random model reach it), so
# the device loop runs until that token and the rounds, with the grammar's masks, after it
TOOLS='[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string","maxLength":4}},"required":["city"],"additionalProperties":false}}}]'
tcall() {
  curl -s "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
    -d "{\"messages\":[{\"role\":\"user\",\"content\":\"weather in Paris?\"}],\"tools\":$TOOLS,\"max_tokens\":120,\"temperature\":1,\"seed\":2,\"logit_bias\":{\"$(printf '<tool_call>' | "$B/lily" tokenize --special --tokenizer "$T/m" | tr -d ' \n')\":4},\"chat_template_kwargs\":{\"enable_thinking\":false}}" |
    python3 -c 'import json,sys; c=json.load(sys.stdin)["choices"][0]; m=c["message"]; tc=[{k: v for k, v in t.items() if k != "id"} for t in (m.get("tool_calls") or [])]; print(json.dumps([m.get("content"), tc, c["finish_reason"]]))'
}
for mode in 0 1; do
  LILY_SRV_DEVICE_LOOP=$mode eserve
  tc[$mode]=$(tcall)
  tt[$mode]=$(metric lily_device_loop_tokens_total)
done
echo "${tc[1]}" | grep -q '"get_weather"' && [ "${tt[1]}" -ge 1 ] && [ "${tc[0]}" = "${tc[1]}" ] &&
  ok "tools: the device loop until <tool_call>, the grammar's rounds after, as the rounds alone (${tt[1]} tokens on the device)" ||
  bad "tools: device loop (${tt[1]} tokens) '${tc[1]}' vs rounds '${tc[0]}'"
# a client that disconnects while its stream runs in the device loop: the run ends there, the slot
# is freed, and the next request is answered as before
LILY_SRV_DEVICE_LOOP=1 eserve
before=$(metric lily_requests_cancelled_total)
curl -s -N "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "{\"messages\":$LONG,\"max_tokens\":2000,\"temperature\":0,\"ignore_eos\":true,\"stream\":true}" >"$T/cut" 2>/dev/null &
cp=$!
for _ in $(seq 300); do [ "$(metric lily_device_loop_runs_total)" -ge 1 ] && break; sleep 0.05; done
sleep 0.3
kill $cp 2>/dev/null; wait $cp 2>/dev/null
running=1
for _ in $(seq 100); do running=$(curl -s "http://127.0.0.1:$port/metrics" | awk '$1=="lily_requests_running" {print $2}'); [ "$running" = 0 ] && break; sleep 0.1; done
after=$(metric lily_requests_cancelled_total)
again=$(gen "$LONG" 24 '"temperature":0,"ignore_eos":true')
grep -q '^data: {' "$T/cut" && [ "$running" = 0 ] && [ "$after" -ge $((before + 1)) ] && [ "$(metric lily_device_loop_runs_total)" -ge 2 ] &&
  [ "$again" = "${ref[0,g]}" ] && ok "a disconnect mid-run cancels it and frees the slot; the next answer is unchanged" ||
  bad "disconnect in the device loop: running $running, cancelled $before -> $after, runs $(metric lily_device_loop_runs_total), next '$again' vs '${ref[0,g]}'"
it_done
