#!/usr/bin/env python3
"""Differential test of `lily render` against the real chat templates under Jinja2.

Generates random chat requests (roles in random order, tools with nested schemas,
unicode and unicode whitespace, <think>/</think> inside content, several tool calls,
tool results, every enable_thinking / preserve_thinking / add_generation_prompt combo,
and requests the template rejects), renders each with Jinja2 set up the way
transformers' apply_chat_template does, renders the same request with
`lily render --jsonl`, and compares bytes. A request Jinja2 rejects must be rejected.

usage: chat_template_diff.py LILY_BINARY TEMPLATE_DIR [N_PER_TEMPLATE] [SEED]
Prints one line per failure and ends with "N passed, N failed".
"""
import json
import os
import random
import subprocess
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class TemplateRaised(Exception):
    pass


def raise_exception(message):
    raise TemplateRaised(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers replaces Jinja's tojson (which HTML-escapes) by plain json.dumps
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


PIECES = [
    "hello", "world", "Paris", "x", "42", "3.5", "true", "null", "{\"a\": 1}", "[1, 2]",
    " ", "  ", "\n", "\n\n", "\t", "\r\n", "\u00a0", "\u3000", "\u2028", "\u2003", "\x1c", "\x85", "\x0b", "\u1680", "\u205f", "\u202f", "\u2029", "\x0c",
    "é", "naïve", "中文", "日本語", "😀", "👍🏽", "e\u0301", "\u05e9\u05dc\u05d5\u05dd", "\ufeff",
    "\"", "\\", "'", "<", ">", "&", "\x01", "\x1f", "\x7f", "\u200b",
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
    "<|im_start|>", "<|im_end|>", "<function=f>", "<parameter=p>",
]


def rstr(rng, max_pieces=8):
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, max_pieces)))


def rkey(rng):
    return rng.choice(["city", "unit", "n", "query", "a", "b", "ключ", "名前", "x y", "", "q\"k", "k\\", "v\n"]) + (
        str(rng.randint(0, 9)) if rng.random() < 0.3 else "")


def rfloat(rng):
    return rng.choice([
        0.1, 1.0, -0.0, 0.0, 1e-7, 1e16, 1e15, 123456789012345678.0, 1e22, 5e-324, 1.7976931348623157e308,
        0.0001, 0.00001, 2.5, -3.75, 1 / 3, 100.0, 1e-05 * 3,
        rng.uniform(-1e6, 1e6), rng.uniform(-1, 1) * 10 ** rng.randint(-30, 30), 2.0 ** rng.randint(-1074, 1023), round(rng.uniform(-100, 100), 2),
    ])


def rvalue(rng, depth=0):
    r = rng.random()
    if depth < 3 and r < 0.12:
        return {rkey(rng): rvalue(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    if depth < 3 and r < 0.22:
        return [rvalue(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if r < 0.55:
        return rstr(rng, 5)
    if r < 0.68:
        return rng.choice([0, 1, -1, 7, 2 ** 53, -(2 ** 62), rng.randint(-10 ** 9, 10 ** 9)])
    if r < 0.8:
        return rfloat(rng)
    if r < 0.92:
        return rng.choice([True, False])
    return None


def rschema(rng, depth=0):
    t = rng.choice(["string", "integer", "number", "boolean", "array", "object", "null"] if depth < 2 else ["string", "integer"])
    s = {"type": t}
    if rng.random() < 0.5:
        s["description"] = rstr(rng, 4)
    if t == "string" and rng.random() < 0.3:
        s["enum"] = [rstr(rng, 2) for _ in range(rng.randint(1, 3))]
    if t == "array":
        s["items"] = rschema(rng, depth + 1)
    if t == "object":
        s["properties"] = {rkey(rng): rschema(rng, depth + 1) for _ in range(rng.randint(0, 3))}
        if rng.random() < 0.5:
            s["required"] = list(s["properties"])[:1]
    if rng.random() < 0.2:
        s["default"] = rvalue(rng, 2)
    return s


def rtool(rng):
    if rng.random() < 0.05:
        return rng.choice([{"odd": [1, 2.5, None]}, "just a string", 17])  # printed by tojson all the same
    fn = {"name": rng.choice(["get_weather", "search", "run_code", "f", "noms_été"]) + str(rng.randint(0, 99))}
    if rng.random() < 0.8:
        fn["description"] = rstr(rng, 6)
    fn["parameters"] = rschema(rng) if rng.random() < 0.2 else {
        "type": "object", "properties": {rkey(rng): rschema(rng) for _ in range(rng.randint(0, 4))}, "required": []}
    return {"type": "function", "function": fn}


def rcontent(rng, allow_parts=True, allow_null=True):
    r = rng.random()
    if allow_parts and r < 0.15:
        parts = []
        for _ in range(rng.randint(0, 3)):
            p = {"type": "text", "text": rstr(rng)}
            if rng.random() < 0.2:
                p = {"text": rstr(rng)}  # no type: still a text part for the template
            parts.append(p)
        return parts
    if allow_null and r < 0.22:
        return None
    if r < 0.3:
        return "<tool_response>" + rstr(rng, 3) + "</tool_response>"
    return rstr(rng)


def rcall(rng, flat, qwen3):
    args = {rkey(rng): rvalue(rng) for _ in range(rng.randint(0, 4))}
    body = {"name": rng.choice(["get_weather", "search", "f", "工具"]) + str(rng.randint(0, 9))}
    if not (rng.random() < 0.1 and not qwen3):
        body["arguments"] = args
    if flat:
        return body
    call = {"type": "function", "function": body}
    if rng.random() < 0.7:
        call["id"] = "call_%d" % rng.randint(0, 10 ** 6)
    return call


def rmessage(rng, role, qwen3):
    m = {"role": role}
    if role == "assistant":
        r = rng.random()
        if r < 0.3:
            m["content"] = rstr(rng, 3) + "<think>" + rstr(rng, 4) + "</think>" + rstr(rng, 4)
        elif r < 0.4:
            m["content"] = rstr(rng, 3) + "</think>" + rstr(rng, 3) + "</think>" + rstr(rng)
        elif r < 0.45 and not qwen3:
            pass  # no content key at all
        else:
            m["content"] = rcontent(rng, allow_parts=not qwen3, allow_null=not qwen3)
        r = rng.random()
        if r < 0.3:
            m["reasoning_content"] = rstr(rng)
        elif r < 0.35:
            m["reasoning_content"] = ""
        elif r < 0.4:
            m["reasoning_content"] = None
        if rng.random() < 0.4:
            flat = rng.random() < 0.15
            m["tool_calls"] = [rcall(rng, flat, qwen3) for _ in range(rng.randint(0, 3))]
    else:
        m["content"] = rcontent(rng, allow_parts=not qwen3, allow_null=not qwen3 and role != "system")
        if role == "tool" and rng.random() < 0.5:
            m["tool_call_id"] = "call_1"
    return m


def rrequest(rng, qwen3):
    msgs = []
    if rng.random() < 0.5:
        msgs.append(rmessage(rng, "system", qwen3))
    for _ in range(rng.randint(1, 7)):
        msgs.append(rmessage(rng, rng.choice(["user", "user", "assistant", "assistant", "tool"]), qwen3))
    if rng.random() < 0.7:  # most conversations have a real user query
        msgs.insert(rng.randint(1 if msgs and msgs[0]["role"] == "system" else 0, len(msgs)),
                    {"role": "user", "content": rstr(rng) + "q"})
    if rng.random() < 0.06:  # system message later on: the Qwen3.5/3.6 templates refuse it
        msgs.insert(rng.randint(1, len(msgs)), rmessage(rng, "system", qwen3))
    if not qwen3 and rng.random() < 0.04:
        msgs.insert(rng.randint(0, len(msgs)), {"role": rng.choice(["developer", "function", "bot"]), "content": "x"})
    if not qwen3 and rng.random() < 0.03:
        msgs.append({"role": "user", "content": [{"type": "audio", "data": "x"}]})
    if not qwen3 and rng.random() < 0.03:
        msgs.append({"role": "user", "content": rng.choice([5, {"text": "x"}, True])})
    if not qwen3 and rng.random() < 0.03:
        msgs.append({"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": rng.choice([None, [1, 2], 3])}}]})
    if rng.random() < 0.02:
        msgs = []
    req = {"messages": msgs}
    if rng.random() < 0.4:
        req["tools"] = [rtool(rng) for _ in range(rng.randint(0, 3))]
    elif rng.random() < 0.1:
        req["tools"] = None
    kw = {}
    for name, values in (("enable_thinking", [True, False, False, 0, None]), ("preserve_thinking", [True, True, False, 1]),
                         ("add_generation_prompt", [True, False, False, 0, 1, ""])):
        if rng.random() < 0.5:
            kw[name] = rng.choice(values)
    if kw:
        req["chat_template_kwargs"] = kw
    if rng.random() < 0.2:
        req["add_generation_prompt"] = rng.choice([True, False])
    return req


def jinja_render(template, req):
    kw = dict(req.get("chat_template_kwargs") or {})
    agp = kw.pop("add_generation_prompt", req.get("add_generation_prompt", True))
    return template.render(messages=req["messages"], tools=req.get("tools"), add_generation_prompt=agp,
                           bos_token="", eos_token="<|im_end|>", pad_token="<|endoftext|>", **kw)


def wire_form(rng, req, qwen3):
    """The request as a client would send it to lily: tool-call arguments often as JSON
    strings (the OpenAI wire form). Qwen3 prints a string verbatim, so there both sides
    get the same representation."""
    out = json.loads(json.dumps(req))
    if qwen3:
        return out
    for m in out["messages"]:
        for c in m.get("tool_calls") or []:
            body = c.get("function", c)
            if isinstance(body.get("arguments"), dict) and rng.random() < 0.5:
                body["arguments"] = json.dumps(body["arguments"], ensure_ascii=rng.random() < 0.5)
    return out


def main():
    lily, tdir = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 300
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else random.SystemRandom().randrange(2 ** 32)
    print("seed %d, %d requests per template" % (seed, n))
    env = make_env()
    kinds = [("qwen3.6", "qwen3.6/chat_template.jinja"), ("qwen3.5", "templates/Qwen3.5-4B.jinja"),
             ("qwen3", "templates/Qwen-Qwen3-0.6B.jinja")]
    passed = failed = 0
    for kind, path in kinds:
        with open(os.path.join(tdir, path), encoding="utf-8") as f:
            template = env.from_string(f.read())
        rng = random.Random("%d-%s" % (seed, kind))
        cases = []
        for _ in range(n):
            req = rrequest(rng, kind == "qwen3")
            try:
                expected = jinja_render(template, req)
            except (TemplateRaised, jinja2.exceptions.TemplateError, TypeError, AttributeError, IndexError) as e:
                expected = e
            cases.append((req, wire_form(rng, req, kind == "qwen3"), expected))
        lines = "".join(json.dumps(c[1], ensure_ascii=rng.random() < 0.5) + "\n" for c in cases)
        res = subprocess.run([lily, "render", "--template", kind, "--jsonl"], input=lines.encode(),
                             capture_output=True)
        outs = [json.loads(l) for l in res.stdout.decode().splitlines()]
        if res.returncode != 0 or len(outs) != len(cases):
            print("FAIL %s: lily render --jsonl exited %d with %d/%d lines: %s" % (
                kind, res.returncode, len(outs), len(cases), res.stderr.decode()[-500:]))
            failed += 1
            continue
        n_err = 0
        for (req, wire, expected), got in zip(cases, outs):
            if isinstance(expected, Exception):
                n_err += 1
                ok = "error" in got
            else:
                ok = got.get("prompt") == expected
            if ok:
                passed += 1
                continue
            failed += 1
            if failed <= 5:
                print("FAIL %s seed %d\n  request: %s\n  jinja:   %r\n  lily:    %r" % (
                    kind, seed, json.dumps(wire, ensure_ascii=False), expected, got))
        print("%s: %d requests, %d rejected by the template" % (kind, len(cases), n_err))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
