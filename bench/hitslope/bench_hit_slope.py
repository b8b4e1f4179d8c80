"""How a prefix-cache hit's TTFT grows with the cached prompt length, measured on real vLLM for CPU.

A full prefix hit recomputes one token, so its forward hardly grows with the prompt. What does grow is the
host's work per prompt token: the HTTP body, tokenization, the block hashes the prefix cache looks up, the
request's trip to the engine core, the scheduler's per-block bookkeeping. That work is the same code on a GPU
engine, so its slope, measured here, is the one constant the laptop profile cannot get from the seed's
1,480-token figures (``kvoffload_lab.engine.costmodel``).

For each prompt length: a fresh random text of that many tokens (counted by the server's own /tokenize) is
sent twice through /v1/completions (stream, max_tokens 1); TTFT is the time to the first streamed chunk, and the
second is the hit. The server's prefix-cache counters confirm the hits. The slope is a least-squares line
through the per-length medians.

    .venv/bin/python bench/hitslope/bench_hit_slope.py --vllm .venv-vllm/bin/vllm --model .tiny-model \
        --json bench/hitslope/results.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

BLOCK = 128  # vLLM for CPU's block size (vllm/platforms/cpu.py); a GPU engine's is 16
BLOCKS = (2, 4, 6, 8, 10, 12, 14)
"""Prompt lengths in full blocks, each plus ``--tail`` tokens past its last full block: a hit recomputes the same
tail at every length, so the slope is the cached tokens' own cost (a length at a block boundary would recompute
a whole block). The tokenizer may count a token or two under the target, so a tail near 0 can land on a
boundary: keep it well inside the block."""
WORDS = [f"{a}{b}" for a in "bcdfghjklmnpqrstvwz" for b in ("a", "e", "i", "o", "u", "ar", "en", "is", "on")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post(url: str, payload: dict[str, Any], timeout: float = 120) -> Any:
    request = urllib.request.Request(url, json.dumps(payload).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return json.loads(answer.read())


def ttft(base: str, model: str, text: str) -> float:
    body = {"model": model, "prompt": text, "max_tokens": 1, "stream": True, "temperature": 0}
    request = urllib.request.Request(
        f"{base}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=120) as answer:
        for line in answer:
            if line.startswith(b"data: ") and b"[DONE]" not in line:
                return time.perf_counter() - started
    raise RuntimeError("no streamed chunk")


def count(base: str, model: str, text: str) -> int:
    return len(post(f"{base}/tokenize", {"model": model, "prompt": text})["tokens"])


def text_of(base: str, model: str, tokens: int, rng: random.Random) -> tuple[str, int]:
    """Random words, trimmed a word at a time until the server's tokenizer counts at most ``tokens``; the text
    and its count."""
    words = [rng.choice(WORDS) for _ in range(tokens)]
    while (n := count(base, model, " ".join(words))) > tokens + 8:
        words = words[: len(words) - max(1, (n - tokens) // 3)]
    while (n := count(base, model, " ".join(words))) > tokens:
        words.pop()
    return " ".join(words), n


def prefix_hits(base: str) -> float:
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return sum(float(m) for m in re.findall(r"^vllm:prefix_cache_hits_total\{[^}]*\} ([0-9.e+]+)$", text, re.M))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm", type=Path, required=True, help="the vllm executable (vLLM for CPU)")
    parser.add_argument("--model", type=Path, required=True, help="a local model folder")
    parser.add_argument("--samples", type=int, default=15, help="prompts per length")
    parser.add_argument("--tail", type=int, default=64, help="tokens past the last full block (2 to 127)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    port = free_port()
    base, name = f"http://127.0.0.1:{port}", "m"
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    command = [str(args.vllm), "serve", str(args.model), "--served-model-name", name, "--host", "127.0.0.1"]
    command += ["--port", str(port), "--max-model-len", "2048", "--enforce-eager", "--enable-prefix-caching"]
    log = Path(tempfile.mkdtemp()) / "serve.log"
    with log.open("wb") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                urllib.request.urlopen(f"{base}/health", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    sys.stderr.write(log.read_text()[-3000:])
                    return 1
                time.sleep(1)
        rng = random.Random(11)
        ttft(base, name, text_of(base, name, 64, rng)[0])  # warm the server's paths up
        rows = []
        for tokens in (BLOCK * k + args.tail for k in BLOCKS):
            cold, hit, counts = [], [], []
            hits_before = prefix_hits(base)
            for _ in range(args.samples):
                text, n = text_of(base, name, tokens, rng)
                counts.append(n)
                cold.append(ttft(base, name, text))
                hit.append(ttft(base, name, text))
            hit_tokens = prefix_hits(base) - hits_before
            row = {
                "promptTokens": statistics.median(counts),
                "promptTokensRange": [min(counts), max(counts)],
                "coldMs": round(1000 * statistics.median(cold), 3),
                "hitMs": round(1000 * statistics.median(hit), 3),
                "hitMsAll": [round(1000 * h, 3) for h in hit],
                "prefixCacheHitTokens": hit_tokens,
            }
            rows.append(row)
            print(
                f"{tokens:5d} tokens  cold {row['coldMs']:8.2f} ms  hit {row['hitMs']:7.2f} ms  "
                f"prefix-cache hit tokens {hit_tokens:.0f}",
                flush=True,
            )
        xs = [r["promptTokens"] for r in rows]
        ys = [r["hitMs"] / 1000 for r in rows]
        slope, intercept = statistics.linear_regression(xs, ys)
        print(f"hit TTFT slope: {slope * 1e6:.3f} µs per cached prompt token (intercept {intercept * 1000:.2f} ms)")
        if args.json:
            result = {
                "command": " ".join(sys.argv),
                "vllm": subprocess.run([str(args.vllm), "--version"], capture_output=True, text=True).stdout.strip(),
                "samplesPerLength": args.samples,
                "tailTokens": args.tail,
                "rows": rows,
                "hitSlopeSecondsPerToken": slope,
                "hitInterceptSeconds": intercept,
                "cpus": os.cpu_count(),
            }
            args.json.write_text(json.dumps(result, indent=2) + "\n")
        return 0
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
