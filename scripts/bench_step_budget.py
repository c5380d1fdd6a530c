"""What the batch program's step budget costs: tokens/s of one batch of requests decoded with no
budget (each execution runs until a request finishes while others wait) and with budgets of a few
steps (each execution returns to the host after that many steps, as alodlm-jax-serve runs it).

    python scripts/bench_step_budget.py                       # builtin:tiny, batch 8, 32 prompts
    python scripts/bench_step_budget.py --budgets 1,4,16 --repeats 5

The tokens of every budget are checked equal to the unbudgeted run's (the budget moves none). The
programs compile before any timing (the budget is an operand: one program for all). Each budget's
figure is the median of --repeats runs; the runs interleave the budgets so that the machine's
drift spreads over all of them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:tiny")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--window_size", type=int, default=4)
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--budgets", default="1,4", help="comma-separated step budgets; 'none' "
                        "(no budget) always runs")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import numpy as np

    from alodlm_jax.config import DecodeConfig
    from alodlm_jax.data import resolve_builtin
    from alodlm_jax.decode import batched
    from alodlm_jax.decode.window import NO_STEP_BUDGET
    from alodlm_jax.generate import build_generator

    decode = DecodeConfig(window_size=args.window_size, max_new_tokens=args.max_new_tokens)
    generator = build_generator(model=resolve_builtin(args.model), decode_config=decode,
                                engine="compiled", batch_size=args.batch)
    engine = generator.engine
    rng = np.random.default_rng(0)
    limit = min(32, generator.cfg.max_position_embeddings - args.max_new_tokens)
    prompts = [rng.integers(4, generator.cfg.vocab_size, size=int(rng.integers(1, limit + 1))
                            ).tolist() for _ in range(args.prompts)]
    batched.compile_batch(engine, engine.bucket_for(max(map(len, prompts)), batch=args.batch))
    budgets = [NO_STEP_BUDGET] + [int(b) for b in args.budgets.split(",") if b]
    seconds: dict[int, list[float]] = {b: [] for b in budgets}
    tokens: dict[int, list] = {}
    for _ in range(args.repeats):
        for budget in budgets:
            t0 = time.perf_counter()
            outs = engine.generate_batch(prompts, step_budget=budget)
            seconds[budget].append(time.perf_counter() - t0)
            tokens.setdefault(budget, [o.token_ids for o in outs])
    reference = tokens[NO_STEP_BUDGET]
    count = sum(map(len, reference))
    base = statistics.median(seconds[NO_STEP_BUDGET])
    rows = []
    for budget in budgets:
        assert tokens[budget] == reference, f"step budget {budget} moved a token"
        median = statistics.median(seconds[budget])
        rows.append({"step_budget": "none" if budget == NO_STEP_BUDGET else budget,
                     "seconds": round(median, 3), "tokens_per_second": round(count / median, 1),
                     "relative": round(base / median, 3)})
    print(json.dumps({"model": args.model, "batch": args.batch, "prompts": args.prompts,
                      "generated_tokens": count, "max_depth": generator.cfg.max_depth,
                      "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
