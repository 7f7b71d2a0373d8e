"""Extractive question answering (issue 58): SQuAD v1.1/v2.0 JSON and JSON Lines read and checked, windows over
long contexts as transformers' run_qa.py makes them, answers put back into the original text by character offsets,
the null answer of v2.0, and exact match and F1 against the official SQuAD evaluation scripts (copied below)."""

from __future__ import annotations

import collections
import inspect
import json
import random
import re
import string
from pathlib import Path

import numpy as np
import pytest
import tokenizers
import torch
import torch.nn.functional as F
from tokenizers import processors

from bertgpu.data.tokenizer import Tokenizer
from bertgpu.errors import UserError
from bertgpu.finetuning import base
from bertgpu.finetuning.question_answering import TASK, QAExamples, f1_v1, f1_v2, normalize_answer, squad_scores

NAMES = ["start", "end"]


# --- The official scripts, as they are (evaluate-v1.1.py and evaluate-v2.0.py), the reference of the scorer ---------


def v1_normalize_answer(s):
    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def v1_f1_score(prediction, ground_truth):
    prediction_tokens = v1_normalize_answer(prediction).split()
    ground_truth_tokens = v1_normalize_answer(ground_truth).split()
    common = collections.Counter(prediction_tokens) & collections.Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    f1 = (2 * precision * recall) / (precision + recall)
    return f1


def v1_exact_match_score(prediction, ground_truth):
    return v1_normalize_answer(prediction) == v1_normalize_answer(ground_truth)


def v1_metric_max_over_ground_truths(metric_fn, prediction, ground_truths):
    scores_for_ground_truths = []
    for ground_truth in ground_truths:
        score = metric_fn(prediction, ground_truth)
        scores_for_ground_truths.append(score)
    return max(scores_for_ground_truths)


def v1_evaluate(dataset, predictions):
    f1 = exact_match = total = 0
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                total += 1
                ground_truths = list(map(lambda x: x["text"], qa["answers"]))
                prediction = predictions[qa["id"]]
                exact_match += v1_metric_max_over_ground_truths(v1_exact_match_score, prediction, ground_truths)
                f1 += v1_metric_max_over_ground_truths(v1_f1_score, prediction, ground_truths)
    exact_match = 100.0 * exact_match / total
    f1 = 100.0 * f1 / total
    return {"exact_match": exact_match, "f1": f1}


def v2_normalize_answer(s):
    def remove_articles(text):
        regex = re.compile(r"\b(a|an|the)\b", re.UNICODE)
        return re.sub(regex, " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def v2_get_tokens(s):
    if not s:
        return []
    return v2_normalize_answer(s).split()


def v2_compute_exact(a_gold, a_pred):
    return int(v2_normalize_answer(a_gold) == v2_normalize_answer(a_pred))


def v2_compute_f1(a_gold, a_pred):
    gold_toks = v2_get_tokens(a_gold)
    pred_toks = v2_get_tokens(a_pred)
    common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
    num_same = sum(common.values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        # If either is no-answer, then F1 is 1 if they agree, 0 otherwise
        return int(gold_toks == pred_toks)
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(pred_toks)
    recall = 1.0 * num_same / len(gold_toks)
    f1 = (2 * precision * recall) / (precision + recall)
    return f1


def v2_evaluate(dataset, preds):
    """evaluate-v2.0.py's main() without a no-answer probability file (every na_prob 0, threshold 1.0)."""
    qid_to_has_ans = {qa["id"]: bool(qa["answers"]) for a in dataset for p in a["paragraphs"] for qa in p["qas"]}
    exact_scores, f1_scores = {}, {}
    for article in dataset:
        for p in article["paragraphs"]:
            for qa in p["qas"]:
                qid = qa["id"]
                gold_answers = [a["text"] for a in qa["answers"] if v2_normalize_answer(a["text"])]
                if not gold_answers:
                    gold_answers = [""]
                a_pred = preds[qid]
                exact_scores[qid] = max(v2_compute_exact(a, a_pred) for a in gold_answers)
                f1_scores[qid] = max(v2_compute_f1(a, a_pred) for a in gold_answers)

    def make_eval_dict(qid_list):
        total = len(qid_list)
        return {
            "exact": 100.0 * sum(exact_scores[k] for k in qid_list) / total,
            "f1": 100.0 * sum(f1_scores[k] for k in qid_list) / total,
            "total": total,
        }

    out = make_eval_dict(list(exact_scores))
    has_ans = [k for k, v in qid_to_has_ans.items() if v]
    no_ans = [k for k, v in qid_to_has_ans.items() if not v]
    for prefix, qids in (("HasAns", has_ans), ("NoAns", no_ans)):
        if qids:
            out.update({f"{prefix}_{k}": v for k, v in make_eval_dict(qids).items()})
    return out


# --- Hand-made data whose right answers are known ---------------------------------------------------------------

EIFFEL = "The Eiffel Tower, in Paris, was finished in 1889 for the World's Fair."
ZURICH = "Zürich, the largest city of Switzerland, lies on Lake Zürich. Its airport is Kloten."
V1 = {
    "version": "1.1",
    "data": [
        {
            "title": "Towers",
            "paragraphs": [
                {
                    "context": EIFFEL,
                    "qas": [
                        {
                            "id": "e1",
                            "question": "When was the Eiffel Tower finished?",
                            "answers": [{"text": "1889", "answer_start": 44}, {"text": "in 1889", "answer_start": 41}],
                        },
                        {
                            "id": "e2",
                            "question": "Where is the tower?",
                            "answers": [
                                {"text": "Paris", "answer_start": 21},
                                {"text": "in Paris", "answer_start": 18},
                            ],
                        },
                    ],
                }
            ],
        },
        {
            "title": "Cities",
            "paragraphs": [
                {
                    "context": ZURICH,
                    "qas": [
                        {
                            "id": "z1",
                            "question": "Which is the largest city of Switzerland?",
                            "answers": [{"text": "Zürich", "answer_start": 0}],
                        }
                    ],
                }
            ],
        },
    ],
}


def v2_data() -> dict:
    data = json.loads(json.dumps(V1))
    data["version"] = "v2.0"
    data["data"][1]["paragraphs"][0]["qas"].append(
        {"id": "z2", "question": "What is the capital of Austria?", "answers": [], "is_impossible": True}
    )
    return data


def write_json(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
    return path


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tokenizer(uncased_vocab) -> Tokenizer:
    return Tokenizer(uncased_vocab, lowercase=True)


def perfect_outputs(encoded, high: float = 8.0, low: float = -8.0) -> torch.Tensor:
    """What a model that knows the answers would give: each row's label tokens high, every other position low."""
    out = torch.full((len(encoded), int(encoded.lengths.max()), 2), low, dtype=torch.float64)
    for r, (start, end) in enumerate(encoded.labels):
        out[r, start, 0] = high
        out[r, end, 1] = high
        out[r, int(encoded.lengths[r]) :] = 0  # as the loops gather them: zero past a row's length
    return out


def row_tokens(encoded, row: int, start: int, end: int) -> tuple[int, int]:
    """The row positions of the first and last context tokens that overlap the characters [start, end)."""
    offsets = encoded.offsets[encoded.context_of[encoded.example[row]]]
    first = encoded.question_tokens[row] + 2
    window = offsets[encoded.window[row] : encoded.window[row] + encoded.window_tokens[row]]
    inside = [k for k, (a, b) in enumerate(window) if a < end and b > start]
    return first + inside[0], first + inside[-1]


# --- Reading ---------------------------------------------------------------------------------------------------


def test_task_implements_every_method_of_the_protocol():
    wanted = [n for n, _ in inspect.getmembers(base.FinetuneTask, inspect.isfunction) if not n.startswith("_")]
    assert wanted and all(callable(getattr(TASK, n, None)) for n in wanted)
    assert (TASK.name, TASK.head, TASK.problem_type, TASK.main_metric) == ("question-answering", "span", None, "f1")
    assert TASK.metrics == ("f1", "exact_match") and TASK.unit == "example"


def test_squad_v1_json_is_read_with_the_line_of_each_question(tmp_path):
    path = write_json(tmp_path / "dev.json", V1)
    examples = TASK.read(path, base.Options())
    assert examples.ids == ["e1", "e2", "z1"] and not examples.v2 and examples.labelled
    assert examples.answers[0] == [("1889", 44), ("in 1889", 41)]
    assert examples.contexts == [EIFFEL, EIFFEL, ZURICH]
    text_lines = path.read_text(encoding="utf-8").splitlines()
    for question, line in zip(examples.questions, examples.lines):
        assert f'"question": "{question}"' in text_lines[line - 1]
    assert TASK.detect(path, base.Options()) == "SQuAD JSON (v1.1)"
    assert TASK.label_names(examples) == NAMES
    line, _ = TASK.describe(examples, NAMES)
    assert "3 questions on 2 contexts, 0 unanswerable" in line


def test_squad_v2_json_and_json_lines(tmp_path):
    json_path = write_json(tmp_path / "v2.json", v2_data())
    examples = TASK.read(json_path, base.Options())
    assert examples.v2 and examples.answers[-1] == [] and examples.ids[-1] == "z2"
    assert TASK.detect(json_path, base.Options()) == "SQuAD JSON (v2.0: unanswerable questions)"
    assert "4 questions on 2 contexts, 1 unanswerable" in TASK.describe(examples, NAMES)[0]
    records = [
        {"id": "a", "context": EIFFEL, "question": "Where?", "answers": {"text": ["Paris"], "answer_start": [21]}},
        {"context": EIFFEL, "question": "Which king?", "answers": {"text": [], "answer_start": []}},
    ]
    jsonl = write_jsonl(tmp_path / "qa.jsonl", records)
    lines = TASK.read(jsonl, base.Options())
    assert lines.ids == ["a", "2"] and lines.lines == [1, 2]  # an id-less line is named by its line
    assert lines.answers == [[("Paris", 21)], []] and lines.v2
    assert TASK.detect(jsonl, base.Options()) == "JSON Lines with context, question and answers"
    unlabelled = write_jsonl(tmp_path / "ask.jsonl", [{"context": EIFFEL, "question": "Where?"}])
    assert not TASK.read(unlabelled, base.Options()).labelled  # what predict reads
    with pytest.raises(UserError, match="no answers to evaluate against"):
        TASK.check_eval(TASK.read(unlabelled, base.Options()), NAMES, "the model")


def test_detect_says_none_for_other_data(tmp_path):
    (tmp_path / "t.csv").write_text("text,label\nhi,1\n")
    write_jsonl(tmp_path / "c.jsonl", [{"text": "hi", "label": "x"}])
    write_json(tmp_path / "o.json", {"data": [{"text": "no paragraphs"}]})
    (tmp_path / "bad.json").write_text("{not json")
    for name in ("t.csv", "c.jsonl", "o.json", "bad.json", "missing.json"):
        assert TASK.detect(tmp_path / name, base.Options()) is None, name


def _pretty(data: dict) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False)


def _line_of(text: str, needle: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if needle in line)


def _bad_json_cases() -> list[tuple[str, str, str, str]]:
    """(file name, content, the line's needle, what the error says) for each bad SQuAD input."""
    cases = []
    moved = json.loads(json.dumps(V1))
    moved["data"][0]["paragraphs"][0]["qas"][1]["answers"][0]["answer_start"] = 3
    cases.append(("moved.json", _pretty(moved), '"Where is the tower?"', "answer 'Paris' is not at its answer_start 3"))
    empty_q = json.loads(json.dumps(V1))
    empty_q["data"][1]["paragraphs"][0]["qas"][0]["question"] = "  "
    cases.append(("q.json", _pretty(empty_q), '"question": "  "', "question 'z1' is empty"))
    empty_c = json.loads(json.dumps(V1))
    empty_c["data"][1]["paragraphs"][0]["context"] = ""
    cases.append(("c.json", _pretty(empty_c), '"context": ""', "a paragraph with an empty context"))
    twice = json.loads(json.dumps(V1))
    twice["data"][1]["paragraphs"][0]["qas"][0]["id"] = "e1"
    cases.append(("ids.json", _pretty(twice), "Which is the largest", "question id 'e1' is already used on line"))
    impossible = v2_data()
    impossible["data"][1]["paragraphs"][0]["qas"][1]["answers"] = [{"text": "Kloten", "answer_start": 77}]
    cases.append(("imp.json", _pretty(impossible), "capital of Austria", "is_impossible but has 1 answer"))
    mixed = json.loads(json.dumps(V1))
    del mixed["data"][0]["paragraphs"][0]["qas"][1]["answers"]
    cases.append(("mixed.json", _pretty(mixed), "Where is the tower", "question 'e2' has no answers but question 'e1'"))
    cases.append(("broken.json", '{\n  "data": [\n    {,}\n  ]\n}', "{,}", "not valid JSON"))
    good = json.dumps({"context": EIFFEL, "question": "Where?", "answers": {"text": ["Paris"], "answer_start": [21]}})
    cases.append(("l.jsonl", f"{good}\n\n{{'context': 1}}\n", "{'context'", "not valid JSON"))
    cases.append(("n.jsonl", f'{good}\n{{"question": "Where?"}}\n', '{"question"', 'no "context"'))
    odd = json.dumps({"context": EIFFEL, "question": "Who?", "answers": {"text": ["x"], "answer_start": [0, 1]}})
    cases.append(("o.jsonl", f"{good}\n{odd}\n", '"Who?"', '"answers" should be'))
    return cases


@pytest.mark.parametrize("name, content, needle, says", _bad_json_cases(), ids=lambda v: str(v)[:12])
def test_each_bad_input_is_one_line_naming_the_file_and_line(tmp_path, name, content, needle, says):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(UserError) as error:
        TASK.read(path, base.Options())
    message = str(error.value)
    assert "\n" not in message and says in message, message
    assert message.startswith(f"{path}:{_line_of(content, needle)}: "), message


def test_a_moved_answer_says_what_is_there_and_not_squad_at_all(tmp_path):
    moved = json.loads(json.dumps(V1))
    moved["data"][0]["paragraphs"][0]["qas"][1]["answers"][0]["answer_start"] = 3
    path = write_json(tmp_path / "moved.json", moved)
    with pytest.raises(UserError, match=r"the context there reads ' Eiff'; the text first appears at 21\)"):
        TASK.read(path, base.Options())
    for content, found in (("[1, 2]", "a JSON list"), ('{"version": "1.1"}', "an object with keys 'version'")):
        (tmp_path / "x.json").write_text(content)
        with pytest.raises(UserError, match=f"^{tmp_path / 'x.json'}: not SQuAD JSON .*found {found}"):
            TASK.read(tmp_path / "x.json", base.Options())


def test_split_keeps_a_contexts_questions_together(tmp_path):
    records = [
        {"id": f"{c}-{q}", "context": f"Context number {c} says {q}.", "question": f"What does {c} say?"}
        for c in range(10)
        for q in range(3)
    ]
    for r in records:
        r["context"] = f"Context number {r['id'][0]} is here."
        r["answers"] = {"text": ["here"], "answer_start": [len(r["context"]) - 5]}
    examples = TASK.read(write_jsonl(tmp_path / "s.jsonl", records), base.Options())
    train, held = TASK.split(examples, 0.2, seed=1)
    assert len(held) == 6 and len(train) == 24
    assert not set(train.contexts) & set(held.contexts)
    assert TASK.split(examples, 0.2, seed=1)[1].ids == held.ids != TASK.split(examples, 0.2, seed=2)[1].ids


# --- The scorer ------------------------------------------------------------------------------------------------


def test_normalisation_and_scores_on_known_cases():
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower" == normalize_answer("eiffel   tower.")
    assert normalize_answer("An apple, a theatre") == "apple theatre"  # articles as words only
    assert normalize_answer("U.S.") == "us" and normalize_answer("Zürich") == "zürich"
    assert f1_v1("Eiffel", "the Eiffel Tower") == pytest.approx(2 / 3)
    assert f1_v1("a", "the") == 0 and f1_v2("the", "a") == 1  # both normalise to nothing: the scripts differ
    scores = squad_scores(["Paris", "1889 for", ""], [["in Paris", "Paris"], ["in 1889"], []], v2=True)
    assert scores["exact_match"] == pytest.approx(2 / 3)  # "Paris" exact, the no-answer right
    assert scores["f1"] == pytest.approx((1 + 0.5 + 1) / 3)
    assert (scores["HasAns_total"], scores["NoAns_total"], scores["NoAns_f1"]) == (2, 1, 1.0)


def test_scorer_equals_the_official_scripts_on_many_cases():
    words = [
        "the",
        "a",
        "An",
        "Paris",
        "paris,",
        "Tower",
        "tower.",
        "U.S.",
        "1,000",
        "—",
        "Zürich",
        "theatre",
        "(x)",
        " ",
    ]
    rng = random.Random(0)
    phrase = lambda: " ".join(rng.choice(words) for _ in range(rng.randint(0, 4)))  # noqa: E731
    for v2 in (False, True):
        qas, predictions = [], {}
        for k in range(400):
            golds = [phrase() for _ in range(rng.randint(0 if v2 else 1, 3))]
            qas.append({"id": str(k), "answers": [{"text": g} for g in golds]})
            predictions[str(k)] = rng.choice([phrase(), rng.choice(golds) if golds else "", ""])
        dataset = [{"paragraphs": [{"qas": qas}]}]
        ours = squad_scores(list(predictions.values()), [[a["text"] for a in qa["answers"]] for qa in qas], v2)
        reference = v2_evaluate(dataset, predictions) if v2 else v1_evaluate(dataset, predictions)
        assert ours["exact_match"] == pytest.approx(reference["exact" if v2 else "exact_match"] / 100, abs=1e-12)
        assert ours["f1"] == pytest.approx(reference["f1"] / 100, abs=1e-12)
        assert 0 < ours["f1"] < 1
        if v2:
            for key in ("HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1"):
                assert ours[key] == pytest.approx(reference[key] / 100, abs=1e-12), key
            assert (ours["HasAns_total"], ours["NoAns_total"]) == (reference["HasAns_total"], reference["NoAns_total"])
    for a, b in ((phrase(), phrase()) for _ in range(300)):
        assert normalize_answer(a) == v1_normalize_answer(a) == v2_normalize_answer(a)
        assert f1_v1(a, b) == v1_f1_score(a, b) and f1_v2(a, b) == v2_compute_f1(a, b)


def test_evaluate_hand_made_files_against_the_official_scripts(tmp_path, tokenizer):
    options = base.Options(max_seq_length=48, doc_stride=8)
    for data, reference in ((V1, v1_evaluate), (v2_data(), v2_evaluate)):
        examples = TASK.read(write_json(tmp_path / "d.json", data), options)
        encoded = TASK.encode(examples, tokenizer, {}, options)
        outputs = perfect_outputs(encoded)
        # one known mistake: question e2 ("Where is the tower?") answered "Eiffel Tower" instead of "Paris"
        row = encoded.rows_of(1)[0]
        start, end = encoded.labels[row]
        wrong = row_tokens(encoded, row, EIFFEL.index("Eiffel Tower"), EIFFEL.index(","))
        outputs[row, start], outputs[row, end] = -8.0, -8.0
        outputs[row, wrong[0], 0], outputs[row, wrong[1], 1] = 8.0, 8.0
        predictions = TASK.predict(outputs, encoded, examples, NAMES, options)
        assert [p["answer"] for p in predictions][:3] == ["1889", "Eiffel Tower", "Zürich"]
        metrics = TASK.evaluate(outputs, encoded, examples, NAMES)
        official = reference(data["data"], json.loads(TASK.render(examples, predictions, None)))
        assert metrics["exact_match"] == pytest.approx(official["exact" if data is not V1 else "exact_match"] / 100)
        assert metrics["f1"] == pytest.approx(official["f1"] / 100)
        assert metrics["examples"] == len(examples) and metrics["loss"] > 0
        assert TASK.eval_line(metrics).startswith("loss ") and "| exact_match " in TASK.eval_line(metrics)
    assert metrics["NoAns_exact"] == 1.0 and metrics["HasAns_f1"] == pytest.approx(2 / 3)  # e2 wrong
    assert TASK.eval_line(metrics).endswith("| HasAns_f1 0.6667 | NoAns_f1 1.0000")  # v2.0's split, in the log too


# --- Windows, offsets and post-processing ----------------------------------------------------------------------

LONG = (
    "Geneva hosts many international bodies. "
    "Basel lies on the Rhine where France, Germany and Switzerland meet. "
    "The Matterhorn rises above Zermatt and draws climbers every summer. "
    "Lucerne keeps a covered wooden bridge from the fourteenth century. "
    "Bern is the federal city, and its old town is a world heritage site. "
    "Lugano speaks Italian and sits by a lake below the Alps. "
    "São  Paulo is not in Switzerland at all, though many Swiss live there. "
    "The biggest city, ZÜRICH-Oerlikon aside, is Zürich, famous for its banks."
)


LENGTH = 32  # --max-seq-length of the windows over LONG


def long_examples() -> QAExamples:
    questions = ["Which city is the biggest?", "Where do many Swiss live abroad?", "What does Lucerne keep?"]
    spans = ["Zürich,", "São  Paulo", "a covered wooden bridge"]
    answers = [[(s, LONG.index(s))] for s in spans]
    return QAExamples(Path("long.json"), ["z", "s", "l"], questions, [LONG] * 3, answers, [1, 2, 3], False)


def test_windows_are_run_qa_s_and_answers_come_back_as_the_original_text(tokenizer):
    examples = long_examples()
    options = base.Options(max_seq_length=LENGTH, doc_stride=8, max_answer_length=30)
    assert len(tokenizer.encode_batch([LONG])[0]) > 3 * options.max_seq_length
    encoded = TASK.encode(examples, tokenizer, {}, options)
    # the rows are the tokenizers library's overflowing windows with this stride, as run_qa.py asks for them
    pair = tokenizers.Tokenizer.from_str(tokenizer.backend.to_str())
    pair.post_processor = processors.BertProcessing(("[SEP]", tokenizer.sep_id), ("[CLS]", tokenizer.cls_id))
    pair.enable_truncation(options.max_seq_length, stride=options.doc_stride, strategy="only_second")
    for i, question in enumerate(examples.questions):
        hf = pair.encode(question, LONG)
        expected = [hf.ids] + [o.ids for o in hf.overflowing]
        rows = encoded.rows_of(i)
        assert [encoded.rows[r].tolist() for r in rows] == expected
        batch = encoded.batch(list(rows))
        assert batch["token_type_ids"][0].tolist() == hf.type_ids
        # the answer's tokens in every window that holds it whole, [CLS] in the others; their offsets give the text
        labelled = [r for r in rows if encoded.labels[r].any()]
        assert labelled and len(labelled) < len(rows)
        for r in labelled:
            start, end = encoded.labels[r]
            ctx = encoded.window[r] - encoded.question_tokens[r] - 2
            offsets = encoded.offsets[encoded.context_of[i]]
            assert LONG[offsets[ctx + start, 0] : offsets[ctx + end, 1]] == examples.answers[i][0][0]
    assert batch["labels"].shape == (len(batch["input_ids"]), 2) and batch["labels"].dtype == torch.long
    assert TASK.output_shape(encoded, 2) == (options.max_seq_length, 2)
    predictions = TASK.predict(perfect_outputs(encoded), encoded, examples, NAMES, options)
    assert [p["answer"] for p in predictions] == ["Zürich,", "São  Paulo", "a covered wooden bridge"]
    assert [p["start"] for p in predictions] == [LONG.index(p["answer"]) for p in predictions]
    assert all(len(p["n_best"]) <= 5 and p["n_best"][0]["text"] == p["answer"] for p in predictions)
    assert TASK.show(predictions[1]).split("\t") == [
        "São Paulo",
        f"{predictions[1]['score']:.4f}",
        examples.questions[1],
    ]


def test_the_null_answer_against_the_threshold_on_v2(tokenizer):
    examples = long_examples()
    examples.answers[2] = []
    examples.v2 = True
    options = base.Options(max_seq_length=LENGTH, doc_stride=8)
    encoded = TASK.encode(examples, tokenizer, {}, options)
    outputs = perfect_outputs(encoded)
    rows = encoded.rows_of(0)
    for r in rows:
        outputs[r, 0] = 10.0  # [CLS]: 20 in every window of question 0
    outputs[rows[-1], 0] = 7.0  # except one: the null score is the least, 14; its best span scores 16
    answers = {t: TASK.predict(outputs, encoded, examples, NAMES, base.Options(null_threshold=t)) for t in (-3, 0)}
    assert answers[-3][0]["answer"] == "" and answers[-3][0]["start"] == -1  # 14 - 16 = -2 > -3: no answer
    assert answers[0][0]["answer"] == "Zürich,"
    assert answers[0][2]["answer"] == "" and answers[0][1]["answer"] == "São  Paulo"  # [CLS] labels: null wins
    assert any(c["text"] == "" for c in answers[0][0]["n_best"])
    metrics = TASK.evaluate(outputs, encoded, examples, NAMES)
    assert metrics["NoAns_total"] == 1 and metrics["NoAns_exact"] == 1.0 and metrics["exact_match"] == 1.0


def test_long_questions_are_cut_and_no_room_is_an_error(tokenizer):
    question = "Which " + " ".join(f"word{i}" for i in range(80)) + "?"
    examples = QAExamples(Path("q.json"), ["x"], [question], [EIFFEL], [[("Paris", 21)]], [7], False)
    encoded = TASK.encode(examples, tokenizer, {}, base.Options(max_seq_length=96, doc_stride=8))
    assert encoded.question_tokens.tolist() == [64] and "cut to their first 64" in encoded.warnings()[0]
    with pytest.raises(
        UserError, match=r"^--max-seq-length 60 leaves no room for the context after the question at q.json:7"
    ):
        TASK.encode(examples, tokenizer, {}, base.Options(max_seq_length=60))
    wide = TASK.encode(long_examples(), tokenizer, {}, base.Options(max_seq_length=LENGTH, doc_stride=128))
    assert "--doc-stride 128 is more than half" in wide.warnings()[0]


# --- Loss ------------------------------------------------------------------------------------------------------


def test_loss_is_transformers_and_does_not_depend_on_padding(tokenizer):
    examples = long_examples()
    encoded = TASK.encode(examples, tokenizer, {}, base.Options(max_seq_length=LENGTH, doc_stride=8))
    torch.manual_seed(0)
    full = [r for r in range(len(encoded)) if encoded.lengths[r] == LENGTH][:4]
    batch = encoded.batch(full)
    logits = torch.randn(len(full), LENGTH, 2, dtype=torch.float64)
    start, end = logits.float().split(1, dim=-1)
    hf = (
        F.cross_entropy(start.squeeze(-1), batch["labels"][:, 0])
        + F.cross_entropy(end.squeeze(-1), batch["labels"][:, 1])
    ) / 2
    assert TASK.loss(logits, batch).dtype == torch.float32
    assert TASK.loss(logits, batch).item() == pytest.approx(hf.item() * len(full), rel=1e-6)  # per row, summed
    short = int(np.argmin(encoded.lengths))
    n = int(encoded.lengths[short])
    assert n < LENGTH
    row = torch.randn(1, n, 2)
    padded = torch.cat([torch.cat([row, torch.full((1, LENGTH - n, 2), 5.0)], 1), logits[:1].float()])  # pads high
    apart = TASK.loss(row, encoded.batch([short])) + TASK.loss(logits[:1], encoded.batch(full[:1]))
    assert TASK.loss(padded, encoded.batch([short, full[0]])).item() == pytest.approx(apart.item(), rel=1e-6)
    sums = TASK.train_sums(perfect_outputs(encoded)[full].float(), batch)
    assert sums["correct"].item() == len(full) == sums["units"].item() == TASK.units(batch).item()
    # evaluate's loss, from the gathered outputs, is the same loss per row
    outputs = torch.zeros(len(encoded), LENGTH, 2, dtype=torch.float64)
    outputs[full] = logits
    everything = encoded.batch(range(len(encoded)))
    assert TASK.evaluate(outputs, encoded, examples, NAMES)["loss"] == pytest.approx(
        TASK.loss(outputs, everything).item() / len(encoded), rel=1e-6
    )


def test_render_writes_the_official_scripts_predictions_file(tokenizer):
    examples = long_examples()
    options = base.Options(max_seq_length=LENGTH, doc_stride=8)
    encoded = TASK.encode(examples, tokenizer, {}, options)
    predictions = TASK.predict(perfect_outputs(encoded), encoded, examples, NAMES, options)
    assert json.loads(TASK.render(examples, predictions, "json")) == {
        "z": "Zürich,",
        "s": "São  Paulo",
        "l": "a covered wooden bridge",
    }
    lines = TASK.render(examples, predictions, "jsonl").decode().splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["z", "s", "l"]
    assert set(predictions[0]) == {"id", "question", "answer", "start", "score", "n_best"}
    json.dumps(predictions)  # serialisable
