"""The refused request types name the task and its output type (no JAX: the model is not built)."""

from __future__ import annotations

import pytest

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402

from alodlm_jax.harness.errors import UnsupportedRequestError  # noqa: E402
from alodlm_jax.harness.model import AlodlmJaxLM  # noqa: E402


def _requests(request_type, task, choices, docs=2):
    return [Instance(request_type, {}, ("context", f" choice{i}"), i, (task, doc, 1))
            for doc in range(docs) for i in range(choices)]


@pytest.mark.parametrize("method, requests, named", [
    ("loglikelihood", _requests("loglikelihood", "arc_easy", 4),
     "task 'arc_easy' (output_type multiple_choice) needs loglikelihood requests"),
    ("loglikelihood", _requests("loglikelihood", "lambada", 1),
     "task 'lambada' (output_type loglikelihood) needs loglikelihood requests"),
    ("loglikelihood_rolling", _requests("loglikelihood_rolling", "wikitext", 1),
     "task 'wikitext' (output_type loglikelihood_rolling) needs loglikelihood_rolling requests"),
])
def test_refusal_names_the_task_and_its_output_type(method, requests, named):
    model = AlodlmJaxLM.__new__(AlodlmJaxLM)  # the refusal needs no loaded model
    with pytest.raises(UnsupportedRequestError) as caught:
        getattr(model, method)(requests)
    assert str(caught.value) == (named + "; alodlm-jax runs only generate_until tasks (a "
                                 "diffusion decoder has no left-to-right likelihood)")
