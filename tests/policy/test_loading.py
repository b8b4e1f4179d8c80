"""A policy file is read as kube-apiserver reads the same object."""

from __future__ import annotations

import json
from pathlib import Path

from kvoffload.policy.loading import as_the_server_reads, load_policy
from tests.policy.render_policies import DATA


def test_a_json_escaped_character_outside_the_bmp_reads_as_the_server_reads_it(tmp_path: Path) -> None:
    # Found by tests/api/test_fuzz.py: json.dumps writes U+3B390 as the pair \ud8ac\udf90, which YAML reads as two
    # lone surrogates (plan refused the string) while the API server's JSON decoder reads one character.
    obj = load_policy(DATA / "render-qwen3-small.yaml").model_dump(by_alias=True, mode="json", exclude_none=True)
    obj["spec"]["model"]["servedModelName"] = "chat-\U0003b390"
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(obj))
    assert "\\ud8ac\\udf90" in path.read_text()
    assert load_policy(path).spec.model.served_model_name == "chat-\U0003b390"


def test_nulls_go_and_a_lone_surrogate_becomes_the_replacement_character() -> None:
    assert as_the_server_reads({"a": None, "b": ["x\ud800y", {"\udc00": 1}]}) == {"b": ["x\ufffdy", {"\ufffd": 1}]}
