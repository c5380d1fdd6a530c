"""The lm-eval model ``alodlm-jax``: lm-eval's ``generate_until`` requests on our decoder.

::

    import lm_eval
    from alodlm_jax.harness.model import AlodlmJaxLM

    lm = AlodlmJaxLM(pretrained="builtin:tiny", q=0.5, tau=0.4, window_size=4, batch_size=8)
    results = lm_eval.simple_evaluate(model=lm, tasks=["my_task"], ...)

or ``lm_eval.simple_evaluate(model="alodlm-jax", model_args="pretrained=...,q=0.5")`` once this
module is imported (it registers the name). Keyword arguments are the evaluate command's flags
(:mod:`alodlm_jax.harness.model_args`); the generator is built exactly as that command builds it
(:func:`alodlm_jax.cli.flags.generator_from_flags`).

``generate_until``: requests are grouped by their ``(until, max_gen_toks)`` (one lm-eval task's
requests usually share them); each group decodes on a generator with that budget whose stop ids
also hold the group's one-token until strings (:mod:`.until`: the answer is the same with or
without that early stop), with ``batch_size`` slots and continuous batching when
``batch_size > 1`` (the compiled engine), one request at a time otherwise. A request without
``max_gen_toks`` gets ``max_new_tokens``. Every prompt is tokenized verbatim, as the evaluate
command does (lm-eval's ``--apply_chat_template`` renders the checkpoint's chat template first,
:meth:`AlodlmJaxLM.apply_chat_template`), and checked against the model's limits before the first
request is decoded. Decoding is greedy: ``do_sample=True`` is refused, other sampling settings
are ignored with a warning.

Per-request counters: lm-eval logs a request's ``arguments`` with each sample (``--log_samples``:
``arguments.gen_args_0.arg_0`` is the prompt, ``arg_1`` the generation settings), and nothing
else of a request that a model can set reaches the samples file (``resps`` are turned into
strings), so after decoding each request's arguments get a third element,
``{"alodlm_jax": record}`` (``arg_2`` in the samples file): the §6.6 result fields except the
text (generated ids, exit depths, passes, windows, timings, stop reason), tokens per window, the
request's budget, engine stop ids and until strings, ``cut_at`` (the until string at which this
model cut the generation; None when the engine itself stopped, on a stop id or an until token,
``stop_reason`` ``eos``, or at the budget), the number of ids the answer keeps and the full
decoded text before the cut. The text a metric sees is the answer alone. lm-eval's
``--use_cache`` stores answers under the arguments as they are after the call; so that a rerun
finds them, each answer is also stored under the request's original arguments (lm-eval's
partial-cache hook). A request answered from the cache has no record.

``loglikelihood`` and ``loglikelihood_rolling`` are refused (:class:`UnsupportedRequestError`): a
diffusion decoder has no left-to-right likelihood of a given continuation.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Sequence

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import normalize_gen_kwargs

from alodlm_jax.harness import MODEL_NAME
from alodlm_jax.harness import model_args as margs
from alodlm_jax.harness.errors import HarnessError, UnsupportedRequestError
from alodlm_jax.harness.until import UntilRule, until_rule

LOG = logging.getLogger(__name__)
RECORD_KEY = "alodlm_jax"
# The settings of a request this decoder honours; any other generation setting is ignored.
HONOURED_GEN_KWARGS = ("until", "max_gen_toks", "do_sample", "temperature")


@dataclasses.dataclass(frozen=True)
class _Plan:
    """How one request decodes: its until rule and budget (its group key)."""

    until: tuple[str, ...]
    max_gen_toks: int


@register_model(MODEL_NAME)
class AlodlmJaxLM(LM):
    """lm-eval's ``LM`` over an alodlm-jax generator (module docstring)."""

    def __init__(self, **model_args: Any) -> None:
        super().__init__()
        self.flag_values = margs.parse_model_args(model_args)
        self.decode = margs.decode_config(self.flag_values)
        from alodlm_jax.cli.flags import generator_from_flags

        try:
            self.generator, self.engine_name, self._device = generator_from_flags(
                self.flag_values, self.decode)
        except HarnessError:
            raise
        except _user_errors() as error:
            raise HarnessError(_one_line(error)) from error
        self.batch_size = self.flag_values.batch_size
        self._generators: dict[_Plan, Any] = {}
        self._warned: set[str] = set()

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict[str, Any],
                            additional_config: dict[str, Any] | None = None) -> "AlodlmJaxLM":
        """lm-eval's constructor from ``model_args`` and its own settings (``batch_size``,
        ``device``, ...), merged by :func:`~alodlm_jax.harness.model_args.with_lm_eval_settings`
        (lm-eval's command line always passes its defaults, which must not clash with a
        ``model_args`` value)."""
        return cls(**margs.with_lm_eval_settings(arg_dict, additional_config))

    @classmethod
    def create_from_arg_string(cls, arg_string: str,
                               additional_config: dict[str, Any] | None = None) -> "AlodlmJaxLM":
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    # -- lm-eval's chat template interface ---------------------------------------------------

    @property
    def tokenizer_name(self) -> str:
        return str(self.generator.model_dir).replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        template = getattr(self.generator.tokenizer, "chat_template", None)
        if isinstance(chat_template, str) and isinstance(template, dict):
            return template.get(chat_template)
        return template

    def apply_chat_template(self, chat_history: list[dict[str, str]],
                            add_generation_prompt: bool = True) -> str:
        """The checkpoint's chat template over lm-eval's messages (as ``alodlm-jax-generate
        --prompt`` renders one user turn: thinking off)."""
        return self.generator.render_chat(chat_history, add_generation_prompt=add_generation_prompt)

    # -- requests ------------------------------------------------------------------------------

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        raise UnsupportedRequestError(_unsupported(requests, "loglikelihood"))

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise UnsupportedRequestError(_unsupported(requests, "loglikelihood_rolling"))

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Answers in request order (module docstring)."""
        from tqdm import tqdm

        unique: dict[int, Any] = {}  # a request repeated (lm-eval's repeats) decodes once
        for request in requests:
            unique.setdefault(id(request), request)
        plans = {key: self._plan(request) for key, request in unique.items()}
        groups: dict[_Plan, list[int]] = {}
        for key, plan in plans.items():
            groups.setdefault(plan, []).append(key)
        generators = {plan: self._generator_for(plan) for plan in groups}
        for key, request in unique.items():  # every prompt before the first is decoded
            try:
                generators[plans[key]].check_prompt(request.args[0])
            except ValueError as error:
                raise HarnessError(f"{_where(request)}: {_one_line(error)}") from None
        answers: dict[int, str] = {}
        with tqdm(total=len(unique), desc="alodlm-jax generate_until",
                  disable=disable_tqdm) as bar:
            for plan, keys in groups.items():
                generator = generators[plan]
                rule = _until_rule(plan, generator)
                prompts = [unique[key].args[0] for key in keys]
                if generator.batch_size > 1:
                    results = generator.generate_stream(prompts)
                else:
                    results = (generator.generate(prompt) for prompt in prompts)
                for key, result in zip(keys, results):
                    answers[key] = self._answer(unique[key], result, rule, generator, plan)
                    bar.update(1)
        return [answers[id(request)] for request in requests]

    def _answer(self, request, result: dict, rule: UntilRule, generator, plan: _Plan) -> str:
        """The answer of one decoded request; logs its record and fills lm-eval's cache hook."""
        text, ended, kept = rule.finish(result["token_ids"], generator.decode_text)
        original = tuple(request.args[:2])
        self.cache_hook.add_partial("generate_until", original, text)
        record = {key: value for key, value in result.items() if key != "text"}
        windows = result["outer_steps"]
        record.update(
            tokens_per_window=result["generated_tokens"] / windows if windows else None,
            max_gen_toks=plan.max_gen_toks,
            engine_stop_ids=list(generator.stop_ids),
            until=list(plan.until),
            cut_at=ended,
            answer_tokens=kept,
            generated_text=result["text"],
        )
        request.arguments = original + ({RECORD_KEY: record},)
        return text

    def _plan(self, request) -> _Plan:
        """The request's until strings and budget from its generation settings (lm-eval's
        normalization, default budget ``max_new_tokens``); sampling is refused."""
        settings = request.args[1] if len(request.args) > 1 else {}
        try:
            kwargs = normalize_gen_kwargs(dict(settings or {}),
                                          default_max_gen_toks=self.decode.max_new_tokens)
        except (TypeError, ValueError) as error:
            raise HarnessError(f"{_where(request)}: generation settings {settings!r}: "
                               f"{_one_line(error)}") from None
        if kwargs.get("do_sample"):
            raise HarnessError(f"{_where(request)}: generation settings ask for sampling "
                               "(do_sample=True or temperature > 0); alodlm-jax decodes greedily")
        ignored = sorted(set(kwargs) - set(HONOURED_GEN_KWARGS) - self._warned)
        if ignored:
            self._warned.update(ignored)
            LOG.warning("alodlm-jax decodes greedily and ignores the generation settings %s",
                        ", ".join(ignored))
        until = kwargs["until"]
        if not all(isinstance(term, str) for term in until):
            raise HarnessError(f"{_where(request)}: until must be strings, got {until!r}")
        budget = kwargs["max_gen_toks"]
        if budget < 1:
            raise HarnessError(f"{_where(request)}: max_gen_toks={budget}: "
                               "Window size and generation budget must be positive")
        return _Plan(until=tuple(until), max_gen_toks=budget)

    def _generator_for(self, plan: _Plan):
        """The generator of a group: the loaded one with the group's budget and stop ids."""
        if plan not in self._generators:
            from alodlm_jax.decode.window import STOP_ID_SLOTS  # the engines' stop-id capacity

            base = self.generator
            rule = _until_rule(plan, base)
            stop_ids = rule.engine_stop_ids(base.stop_ids, max(STOP_ID_SLOTS, len(base.stop_ids)))
            decode = dataclasses.replace(self.decode, max_new_tokens=plan.max_gen_toks)
            if decode == self.decode and stop_ids == list(base.stop_ids):
                self._generators[plan] = base
            else:
                self._generators[plan] = base.with_decode_config(decode, stop_ids=stop_ids)
        return self._generators[plan]


def _until_rule(plan: _Plan, generator) -> UntilRule:
    return until_rule(plan.until, generator.encode_verbatim,
                      lambda token: generator.tokenizer.decode([token], skip_special_tokens=False))


def _user_errors() -> tuple[type[BaseException], ...]:
    from alodlm_jax.cli.flags import USER_ERRORS

    return USER_ERRORS


def _one_line(error: BaseException) -> str:
    from alodlm_jax.cli.flags import first_line

    return first_line(error)


def _where(request) -> str:
    return f"task {request.task_name!r} doc {request.doc_id}"


def _unsupported(requests: Sequence[Any], request_type: str) -> str:
    """One line naming the tasks, their output type and what runs instead."""
    tasks: dict[str, int] = {}
    for request in requests:
        tasks[request.task_name] = max(tasks.get(request.task_name, 0), request.idx)
    if request_type == "loglikelihood":  # multiple_choice tasks ask one per choice (idx > 0)
        named = [f"{name!r} (output_type {'multiple_choice' if top > 0 else 'loglikelihood'})"
                 for name, top in tasks.items()]
    else:
        named = [f"{name!r} (output_type {request_type})" for name in tasks]
    return (f"task {', '.join(named)} needs {request_type} requests; alodlm-jax runs only "
            "generate_until tasks (a diffusion decoder has no left-to-right likelihood)")
