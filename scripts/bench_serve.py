"""alodlm-jax-serve against alodlm-jax-evaluate on the same prompts, in one run: N concurrent
streaming clients (the official openai client) over the sample suite's prompts against the
server, then ``alodlm-jax-evaluate --batch_size N`` over the same task file.

    python scripts/bench_serve.py                    # builtin:tiny, N = 8, the sample suite
    python scripts/bench_serve.py --clients 4 --max_new_tokens 32

Prints one JSON object: the server's throughput (generated tokens over the wall time from the
first request to the last answer), its latency and time to first token (p50, p99; from sending
the request to its last / first streamed text), evaluate's throughput (its summary's generated
tokens over its generation wall time: loading and compiling excluded, as the server's startup is),
their ratio, and whether every prompt's token ids agree. Both sides use the same decoding flags;
the server is started and warmed up (one request) before the clock starts. Each side runs
--rounds times (rounds over the prompts against one server; evaluate runs) and reports its median.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import queue
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

COMMAND = "from alodlm_jax.cli.{0} import run; run()"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def serve(args, prompts, decode_flags):
    import httpx
    import openai

    port = _port()
    process = subprocess.Popen(
        [sys.executable, "-c", COMMAND.format("serve"), "--model", args.model, "--port", str(port),
         f"--batch_size={args.clients}", f"--max_prompt_tokens={args.max_prompt_tokens}",
         *decode_flags], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        while True:
            if process.poll() is not None:
                raise SystemExit(f"the server exited {process.returncode}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
        model = client.models.list().data[0].id
        client.completions.create(model=model, prompt=prompts[0])  # warm-up
        def worker():
            done = []
            while True:
                try:
                    i, prompt = work.get_nowait()
                except queue.Empty:
                    return done
                t0 = time.perf_counter()
                first, last = None, None
                for chunk in client.completions.create(model=model, prompt=prompt, stream=True):
                    if chunk.choices and chunk.choices[0].text and first is None:
                        first = time.perf_counter()
                    if chunk.choices:
                        last = chunk
                end = time.perf_counter()
                ids = last.model_dump()["choices"][0]["alodlm"]["token_ids"]
                done.append((i, ids, (first or end) - t0, end - t0))

        rounds = []
        for _ in range(args.rounds):
            work: queue.Queue = queue.Queue()
            for i, prompt in enumerate(prompts):
                work.put((i, prompt))
            start = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
                results = [r for rs in pool.map(lambda _: worker(), range(args.clients))
                           for r in rs]
            rounds.append((time.perf_counter() - start, results))
        wall, results = sorted(rounds, key=lambda r: r[0])[len(rounds) // 2]  # the median round
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(120)
    tokens = sum(len(ids) for _, ids, _, _ in results)
    return {"tokens": tokens, "seconds": round(wall, 3),
            "tokens_per_second": round(tokens / wall, 1),
            "latency_p50": round(_percentile([r[3] for r in results], 0.5), 3),
            "latency_p99": round(_percentile([r[3] for r in results], 0.99), 3),
            "ttft_p50": round(_percentile([r[2] for r in results], 0.5), 3),
            "ttft_p99": round(_percentile([r[2] for r in results], 0.99), 3)}, \
        {i: ids for i, ids, _, _ in results}


def evaluate(args, task_file, decode_flags):
    runs = sorted((_evaluate_once(args, task_file, decode_flags) for _ in range(args.rounds)),
                  key=lambda run: run[0]["seconds"])
    return runs[len(runs) // 2]  # the median run


def _evaluate_once(args, task_file, decode_flags):
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, "-c", COMMAND.format("evaluate"), "--model", args.model,
                        "--input", task_file, "--output", out, f"--batch_size={args.clients}",
                        "--quiet", *decode_flags], check=True, stdout=subprocess.DEVNULL)
        summary = json.loads(pathlib.Path(out, "summary.json").read_text())
        rows = [json.loads(line) for line in pathlib.Path(out, "predictions.jsonl").open()]
    tokens = sum(len(r["token_ids"]) for r in rows)
    seconds = summary["suite_wall_seconds"]
    return {"tokens": tokens, "seconds": round(seconds, 3),
            "tokens_per_second": round(tokens / seconds, 1)}, \
        {i: r["token_ids"] for i, r in enumerate(rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:tiny")
    parser.add_argument("--input", default="builtin:sample")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--window_size", type=int, default=4)
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--max_prompt_tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="rounds over the prompts (the "
                        "server) and evaluate runs; each side's median is reported")
    args = parser.parse_args()
    from alodlm_jax.data import resolve_builtin

    args.model = resolve_builtin(args.model)
    task_file = resolve_builtin(args.input)
    prompts = [json.loads(line)["prompt"] for line in open(task_file) if line.strip()]
    decode_flags = [f"--window_size={args.window_size}", f"--max_new_tokens={args.max_new_tokens}"]
    server, served = serve(args, prompts, decode_flags)
    batch, evaluated = evaluate(args, task_file, decode_flags)
    same = all(served[i] == evaluated[i] for i in range(len(prompts)))
    print(json.dumps({"model": args.model, "prompts": len(prompts), "clients": args.clients,
                      "rounds": args.rounds,
                      "cpus": os.cpu_count(), "server": server, "evaluate": batch,
                      "throughput_ratio": round(server["tokens_per_second"]
                                                / batch["tokens_per_second"], 3),
                      "same_tokens": same}, indent=1))


if __name__ == "__main__":
    main()
