"""lm-eval's ``local-chat-completions`` model pointed at the server gives the answers of our own
lm-eval model (``alodlm-jax``, what ``alodlm-jax-lm-eval`` runs) on the same offline task, chat
template applied (slow tier)."""

from __future__ import annotations

import json

import pytest

from .conftest import DECODE, MODEL

pytest.importorskip("lm_eval")
pytestmark = pytest.mark.slow
PROMPTS = ["t20 t31 t42", "t33 t21", "t40 t41 t25 t26 t27", "Return value one"]
TASK = "alodlm_tiny_serve"


def test_local_chat_completions_equal_alodlm_jax(server, tmp_path, monkeypatch):
    import lm_eval
    from lm_eval.tasks import TaskManager

    from alodlm_jax.harness.model import AlodlmJaxLM

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"question": p, "answer": "t1"}) + "\n" for p in PROMPTS))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / f"{TASK}.yaml").write_text("\n".join([
        f"task: {TASK}", "dataset_path: json", "dataset_kwargs:", "  data_files:",
        f"    test: {data}", "test_split: test", "output_type: generate_until",
        "doc_to_text: '{{question}}'", "doc_to_target: '{{answer}}'", "generation_kwargs:",
        "  until: ['\\n\\n']", f"  max_gen_toks: {DECODE['max_new_tokens']}",
        "  do_sample: false", "metric_list:", "  - metric: exact_match"]) + "\n")
    tasks = TaskManager(include_path=str(tmp_path / "tasks"))
    remote = lm_eval.simple_evaluate(
        model="local-chat-completions",
        model_args=f"model={MODEL},base_url={server.base_url}/v1/chat/completions,"
                   "num_concurrent=4,max_retries=1,tokenized_requests=False",
        tasks=[TASK], task_manager=tasks, apply_chat_template=True, log_samples=True)
    settings = {k: v for k, v in DECODE.items() if k != "max_new_tokens"}
    local = lm_eval.simple_evaluate(
        model=AlodlmJaxLM(pretrained="builtin:tiny", device="cpu", **settings), tasks=[TASK],
        task_manager=tasks, apply_chat_template=True, log_samples=True)

    def answers(results):
        return {s["doc"]["question"]: s["resps"] for s in results["samples"][TASK]}

    got, want = answers(remote), answers(local)
    assert sorted(got) == sorted(PROMPTS)
    assert got == want
    assert any(r[0][0] for r in want.values())  # answers with text in them
