"""Multiple-choice tasks: ARC, MMLU, MMLU-Pro and GPQA rows as labelled options and a gold label.

The template displays the options with the labels listed here, and the gold label is the label of
the displayed correct option, so ``answer`` always matches what the model was shown:

* ARC keeps the labels its data has (mostly ``A``-``E``, a few questions ``1``-``4``);
* MMLU, MMLU-Pro and GPQA are labelled ``A``, ``B``, ... in the order displayed;
* GPQA's options (the correct answer and three incorrect ones) are permuted per question by a
  pseudo-random permutation keyed by ``--seed`` and the question's ``Record ID``, so a question
  keeps its order whatever subset is prepared; the order is recorded in the row (``option_order``, the
  source's column names in display order) and in the manifest.

Question and option texts are stripped of surrounding whitespace.
"""

from __future__ import annotations

import hashlib
import string
from typing import Any, Sequence

from .items import BuildContext, Item, ItemError

__all__ = ["LETTERS", "arc_items", "mmlu_items", "mmlu_pro_items", "gpqa_items",
           "GPQA_ANSWER_COLUMNS", "gpqa_option_order"]

LETTERS = string.ascii_uppercase
GPQA_ANSWER_COLUMNS = ("Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
                       "Incorrect Answer 3")


def _item(task_id: Any, question: str, labels: Sequence[str], texts: Sequence[str], gold: str,
          extra_context: dict[str, Any] | None = None, extra_fields: dict[str, Any] | None = None,
          ) -> Item:
    if gold not in labels:
        raise ItemError(f"id {task_id!r}: the gold label {gold!r} is not one of the option labels "
                        f"{', '.join(labels)}")
    options = [{"label": label, "text": str(text).strip()} for label, text in zip(labels, texts)]
    context = {"question": str(question).strip(), "options": options, "labels": list(labels)}
    context.update(extra_context or {})
    fields = {"answer": gold, "available_options": list(labels)}
    fields.update(extra_fields or {})
    return Item(id=task_id, context=context, fields=fields)


def _letters(count: int, limit: int, task_id: Any, benchmark: str) -> list[str]:
    if not 2 <= count <= limit:
        raise ItemError(f"id {task_id!r}: {count} options; {benchmark} tasks have 2 to {limit}")
    return list(LETTERS[:count])


def arc_items(rows: list[dict], layout: int, context: BuildContext) -> list[Item]:
    """ARC: ``id``, ``question``, ``choices`` (``text`` and ``label`` lists), ``answerKey``."""
    items = []
    for row in rows:
        choices = row["choices"]
        labels = [str(label).strip() for label in choices["label"]]
        if len(labels) != len(choices["text"]):
            raise ItemError(f"id {row['id']!r}: {len(labels)} labels for "
                            f"{len(choices['text'])} option texts")
        if any(len(label) != 1 or label != label.upper() for label in labels):
            raise ItemError(f"id {row['id']!r}: option labels {labels} are not single uppercase "
                            "characters, which the arc scorer needs")
        items.append(_item(row["id"], row["question"], labels, choices["text"],
                           str(row["answerKey"]).strip()))
    return items


def mmlu_items(rows: list[dict], layout: int, context: BuildContext) -> list[Item]:
    """MMLU: ``question``, ``subject``, ``choices`` (4 texts), ``answer`` (the correct index).

    MMLU has no id column: a row's id is ``<subject>/<n>``, its position among the split's rows of
    that subject (the same whether the ``all`` config or the subject's own is read).
    """
    items, seen = [], {}
    for row in rows:
        subject = row["subject"]
        task_id = f"{subject}/{seen.get(subject, 0)}"
        seen[subject] = seen.get(subject, 0) + 1
        labels = _letters(len(row["choices"]), 4, task_id, "MMLU")  # the mmlu scorer reads A-D
        answer = row["answer"]
        if not isinstance(answer, int) or not 0 <= answer < len(labels):
            raise ItemError(f"id {task_id!r}: answer {answer!r} is not an option index")
        items.append(_item(task_id, row["question"], labels, row["choices"], labels[answer],
                           {"subject": subject}))
    return items


def mmlu_pro_items(rows: list[dict], layout: int, context: BuildContext) -> list[Item]:
    """MMLU-Pro: ``question_id``, ``question``, ``options`` (up to 10), ``answer`` (a letter) and
    ``answer_index``, which must agree; ``category`` is passed to the template."""
    items = []
    for row in rows:
        task_id = row["question_id"]
        labels = _letters(len(row["options"]), 10, task_id, "MMLU-Pro")
        gold = str(row["answer"]).strip()
        index = row["answer_index"]
        if not isinstance(index, int) or not 0 <= index < len(labels) or labels[index] != gold:
            raise ItemError(f"id {task_id!r}: answer {gold!r} does not match answer_index {index!r}")
        items.append(_item(task_id, row["question"], labels, row["options"], gold,
                           {"category": row.get("category")}))
    return items


def gpqa_option_order(seed: int, record_id: str) -> list[int]:
    """The display order of GPQA's four answers (indices into :data:`GPQA_ANSWER_COLUMNS`).

    A pseudo-random permutation keyed by the seed and the record id: the answers sorted by the
    SHA-256 of ``seed:record_id:index``. It depends on nothing else (no library's generator
    version), so it is the same on every machine and Python.
    """
    def key(index: int) -> str:
        return hashlib.sha256(f"gpqa:{seed}:{record_id}:{index}".encode("utf-8")).hexdigest()

    return sorted(range(len(GPQA_ANSWER_COLUMNS)), key=key)


def gpqa_items(rows: list[dict], layout: int, context: BuildContext) -> list[Item]:
    """GPQA: ``Question``, ``Correct Answer``, ``Incorrect Answer 1``-``3``, ``Record ID``."""
    items = []
    for row in rows:
        task_id = str(row["Record ID"]).strip()
        order = gpqa_option_order(context.seed, task_id)
        texts = [row[GPQA_ANSWER_COLUMNS[i]] for i in order]
        if any(text is None or not str(text).strip() for text in texts):
            raise ItemError(f"id {task_id!r}: an answer column is empty")
        labels = list(LETTERS[:len(order)])
        gold = labels[order.index(0)]
        items.append(_item(task_id, row["Question"], labels, texts, gold,
                           extra_fields={"option_order": [GPQA_ANSWER_COLUMNS[i] for i in order]}))
    return items
