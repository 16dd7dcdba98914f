"""AnswerCheck in the stack under Pulumi mocks: after the readiness gate (and before the bench), on
the head, what it judges as its inputs (every node's image, the server's argv, the nodes, the fabric
NCCL is given, the prompt set, the reference's content), the key secret, the stack output `answers`;
nothing under `answers.mode: off`; a reference that cannot be used refused naming the key."""

from __future__ import annotations

import copy
import json

import pytest

from components.answer_check import VERSION
from components.config import ConfigError, parse_stack_config
from components.layout import answer_check_inputs
from tests.support.program import ANSWER_CHECK, dev_raw, mp_stack_config, stack_config
from tests.unit.test_deployment import SECRETS, run_graph, unsecret

REFERENCE = {
    "version": VERSION,
    "made_by": "transformers 5.17, CPU",
    "prompts": {
        "capital-france": {"prompt_ids": [1, 2, 3], "tokens": [12366, 13], "logprobs": [-0.02, -0.4]}
    },
}


def answers_config(answers: dict | None = None, base: dict | None = None) -> dict:
    cfg = copy.deepcopy(base or stack_config("dev"))
    if answers is not None:
        cfg["qwen35-spark:answers"] = answers
    return cfg


def test_the_check_runs_after_the_gate_and_before_the_bench_with_what_it_judges(monkeypatch):
    graph = run_graph(monkeypatch, answers_config({"mode": "enforce", "max_tokens": 8}))
    check = graph.run.named("qwen35-answers")
    assert check.typ == ANSWER_CHECK
    assert "qwen35-ready" in graph.deps["qwen35-answers"]
    assert "qwen35-answers" in graph.deps["qwen35-bench"]
    inputs = check.inputs
    assert inputs["node"]["name"] == "spark-1" and inputs["url"] == "http://127.0.0.1:8000"
    assert inputs["model"] == "qwen3.5-122b" and inputs["mode"] == "enforce"
    assert inputs["settings"]["max_tokens"] == 8 and inputs.get("reference") is None
    assert inputs["prompt_set"]["version"] == VERSION and len(inputs["prompt_set"]["digest"]) == 16
    assert set(inputs["image_ids"]) == {"spark-1", "spark-2"}
    assert all(value.startswith("sha256:") for value in inputs["image_ids"].values())
    server = graph.container("qwen35-vllm").inputs
    assert inputs["server_argv"] == [server["entrypoints"][0], *server["command"]]
    assert inputs["nodes"] == ["spark-1", "spark-2"]
    # What NCCL is given on each node (FabricCheck's: the dev stack pins the HCAs), not the probes'
    # figures, which move every run.
    assert inputs["fabric"] == {
        "spark-1": {"ib_hca": ["rocep1s0f0", "roceP2p1s0f0"]},
        "spark-2": {"ib_hca": ["rocep1s0f0", "roceP2p1s0f0"]},
    }


def test_with_the_fabric_check_off_the_check_is_given_config_s_fabric(monkeypatch):
    cfg = answers_config()
    cfg["qwen35-spark:fabric"] = {**cfg.get("qwen35-spark:fabric", {}), "check": "off", "node_proof": "off"}
    inputs = graph_inputs(monkeypatch, cfg)
    assert set(inputs["fabric"]) == {"spark-1", "spark-2"}
    assert all(node["ib_hca"] for node in inputs["fabric"].values())


def graph_inputs(monkeypatch, cfg: dict) -> dict:
    return run_graph(monkeypatch, cfg).run.named("qwen35-answers").inputs


def test_the_api_key_reaches_the_check_as_a_secret_only(monkeypatch):
    graph = run_graph(monkeypatch, answers_config())
    inputs = graph.run.named("qwen35-answers").inputs
    value, secret = unsecret(inputs["api_key"])
    assert (value, secret) == (SECRETS["api_key"], True)
    assert "api_key" in graph.options["qwen35-answers"]["additional_secret_outputs"]
    plain = {k: v for k, v in inputs.items() if k != "api_key"}
    assert SECRETS["api_key"] not in str(plain)


def test_the_stack_output_answers(monkeypatch):
    out = run_graph(monkeypatch, answers_config({"mode": "report", "min_correct": 2})).run.outputs
    answers = out["answers"]
    assert answers["mode"] == "report" and answers["settings"]["min_correct"] == 2
    assert answers["verdict"] == "pass" and answers["receipts"][0]["id"] == "capital-france"
    assert {"problems", "judged_against", "known_answers", "findings", "version", "checked_at"} <= set(
        answers
    )
    # The accepted receipts are the check's own business, not the stack's output.
    assert "accepted" not in answers and SECRETS["api_key"] not in json.dumps(answers)


def test_off_declares_no_check_and_says_so(monkeypatch):
    graph = run_graph(monkeypatch, answers_config({"mode": "off"}))
    assert graph.run.by_type(ANSWER_CHECK) == []
    assert graph.run.outputs["answers"] == {"mode": "off"}
    assert "qwen35-answers" not in graph.deps["qwen35-bench"]


def test_under_mp_the_check_follows_the_gate_and_every_rank_s_image(monkeypatch):
    graph = run_graph(monkeypatch, mp_stack_config(2))
    inputs = graph.run.named("qwen35-answers").inputs
    assert "qwen35-ready" in graph.deps["qwen35-answers"]
    assert set(inputs["image_ids"]) == {"spark-1", "spark-2"}
    assert "--nnodes" in inputs["server_argv"]


def test_the_reference_s_content_is_an_input(monkeypatch, tmp_path):
    path = tmp_path / "reference.json"
    path.write_text(json.dumps(REFERENCE))
    graph = run_graph(monkeypatch, answers_config({"reference": str(path)}))
    inputs = graph.run.named("qwen35-answers").inputs
    assert inputs["reference"] == REFERENCE
    assert graph.run.outputs["answers"]["reference"] == str(path)


def config_with_reference(path: str) -> object:
    raw = dev_raw()
    raw["answers"] = {"reference": path}
    return parse_stack_config(raw)


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "answers.reference: cannot read"),
        ("{not json", "is not JSON"),
        ({**REFERENCE, "version": "answers-v0"}, "was made for prompt set 'answers-v0'"),
        (
            {**REFERENCE, "prompts": {"capital-spain": REFERENCE["prompts"]["capital-france"]}},
            "'capital-spain' is not",
        ),
        (
            {**REFERENCE, "prompts": {"capital-france": {"tokens": [1, 2], "logprobs": [-0.1]}}},
            "prompt 'capital-france': `logprobs` must give one logprob per token (2)",
        ),
        ({"prompts": []}, "is not a JSON object with `prompts` by prompt id"),
    ],
)
def test_a_reference_that_cannot_be_used_is_refused_naming_the_key(tmp_path, content, said):
    path = tmp_path / "reference.json"
    if content is not None:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(ConfigError) as info:
        answer_check_inputs(config_with_reference(str(path)))
    assert said in str(info.value) and "answers.reference" in str(info.value)


def test_a_relative_reference_is_read_from_the_project_directory(tmp_path):
    (tmp_path / "refs").mkdir()
    (tmp_path / "refs" / "r.json").write_text(json.dumps(REFERENCE))
    assert answer_check_inputs(config_with_reference("refs/r.json"), tmp_path)["reference"] == REFERENCE
