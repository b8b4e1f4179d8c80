"""`kvoffload plan FILE [-o json]`: the sizing an SRE reads before a rollout."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from kvoffload.cli.main import main
from tests.support import paths
from tests.support.receiver import Receiver

CONFIGS = paths.DATA / "configs"

POLICY = """\
apiVersion: kvoffload.io/v1alpha1
kind: KVOffloadPolicy
metadata: {name: qwen3-chat, namespace: llm}
spec:
  model: {name: Qwen/Qwen3-0.6B, image: "vllm/vllm-openai:v0.32.0", maxModelLen: 4096}
  gpu: {class: nvidia-h100-80gb}
  replicas: 4
  resources: {baseMemory: 24Gi, headroom: 4Gi}
  offload:
    cpu: 512Mi
    secondaryTiers:
      - {name: nvme, size: 64Gi, path: /mnt/kv-cache}
  rollout: {pilotCpu: 256Mi}
"""


def plan(tmp_path: Path, text: str, *args: str) -> Result:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return CliRunner().invoke(main, ["plan", str(path), *args])


def test_the_table_shows_the_seed_figures_for_qwen3_0_6b(tmp_path: Path) -> None:
    result = plan(tmp_path, POLICY)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "llm/qwen3-chat" in out
    assert "114,688 B/token" in out
    assert "4,681 tokens" in out  # 512 MiB
    assert "2,340 tokens" in out  # the 256 MiB pilot
    assert "Tier nvme: 64.0 GiB, holds 599,186 tokens" in out
    assert "TierBelowMaxModelLen (cpu-pilot)" in out
    assert "CpuTierBelowGpuKvCache" in out


def test_the_table_has_one_aligned_row_per_level(tmp_path: Path) -> None:
    out = plan(tmp_path, POLICY).stdout.splitlines()
    header = next(i for i, line in enumerate(out) if line.startswith("LEVEL"))
    rows = out[header : header + 5]
    assert [r.split()[1] for r in rows[1:]] == ["gpu-only", "cpu-pilot", "cpu", "nvme"]
    # Right-aligned columns end where their header ends.
    end = rows[0].index("MEMORY REQ=LIMIT") + len("MEMORY REQ=LIMIT")
    assert [r[:end].endswith("GiB") for r in rows[1:]] == [True] * 4
    assert re.search(r"\b28\.0 GiB$", rows[1][:end])
    assert re.search(r"\b28\.5 GiB$", rows[3][:end])  # 24 + 0.5 + 4


def test_json_output_carries_every_level_and_the_warnings(tmp_path: Path) -> None:
    result = plan(tmp_path, POLICY, "-o", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["kvBytesPerToken"] == 114_688
    assert [lv["name"] for lv in doc["levels"]] == ["gpu-only", "cpu-pilot", "cpu", "nvme"]
    cpu = doc["levels"][2]
    assert cpu["cpuTokens"] == 4_681
    assert cpu["pinnedBytes"] == 512 * 1024**2
    assert cpu["shmBytes"] == 512 * 1024**2 + 1024**3
    assert cpu["memoryRequestBytes"] == cpu["memoryLimitBytes"] == (28 * 1024 + 512) * 1024**2
    assert {"code": "TierBelowMaxModelLen", "level": "cpu-pilot"}.items() <= doc["warnings"][0].items()


def test_a_policy_with_a_config_map_is_sized_from_the_configmap_in_the_same_file(tmp_path: Path) -> None:
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "qwen3-8b-config", "namespace": "llm"},
        "data": {"config.json": (CONFIGS / "Qwen3-8B.json").read_text()},
    }
    text = POLICY.replace("name: Qwen/Qwen3-0.6B,", "name: /models/qwen3-8b, configMap: {name: qwen3-8b-config},")
    result = plan(tmp_path, text + "---\n" + yaml.safe_dump(config_map), "-o", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["kvBytesPerToken"] == 147_456
    assert doc["architectureSource"] == "spec.model.architecture"
    assert "GpuKvCacheUnknown" in [w["code"] for w in doc["warnings"]]


def test_a_config_map_missing_from_the_file_is_bad_input_at_its_path(tmp_path: Path) -> None:
    text = POLICY.replace("name: Qwen/Qwen3-0.6B,", "name: /models/x, configMap: {name: x-config},")
    result = plan(tmp_path, text)
    assert result.exit_code == 2
    assert "spec.model.configMap: ConfigMap 'x-config' is not in this file" in result.stderr
    assert "Traceback" not in result.output


def test_a_config_map_with_a_broken_config_json_is_bad_input(tmp_path: Path) -> None:
    config_map = {
        "kind": "ConfigMap",
        "metadata": {"name": "x-config"},
        "data": {"config.json": '{"num_hidden_layers": 2}'},
    }
    text = POLICY.replace("name: Qwen/Qwen3-0.6B,", "name: /models/x, configMap: {name: x-config},")
    result = plan(tmp_path, text + "---\n" + yaml.safe_dump(config_map))
    assert result.exit_code == 2
    assert "spec.model.configMap" in result.stderr
    assert "num_attention_heads" in result.stderr


@pytest.mark.parametrize(
    ("edit", "path"),
    [
        (("nvidia-h100-80gb", "nvidia-h100"), "spec.gpu.class"),
        (("Qwen/Qwen3-0.6B", "acme/unknown-model"), "spec.model.name"),
        (("cpu: 512Mi", "cpu: lots"), "spec.offload.cpu"),
        # Well-formed to Kubernetes, which caps no exponent: a decimal overflow, a float overflow, infinity.
        (("cpu: 512Mi", "cpu: 1e999999999"), "spec.offload.cpu"),
        (("cpu: 512Mi", "cpu: 9e5000"), "spec.offload.cpu"),
        (("cpu: 512Mi", "cpu: .inf"), "spec.offload.cpu"),
        (("cpu: 512Mi", "cpu: 2Pi"), "spec.offload.cpu"),
        (
            ("rollout: {pilotCpu: 256Mi}", "rollout: {pilotCpu: 256Mi, progressDeadline: 600000h}"),
            "spec.rollout.progressDeadline",
        ),
        (("headroom: 4Gi}", "headroom: 4Gi, cpu: 99999999999999999999999999999999999999999}"), "spec.resources.cpu"),
        (("maxModelLen: 4096}", "maxModelLen: 4096, extraArgs: [-tp, '8']}"), "spec.model.extraArgs[0]"),
        (("maxModelLen: 4096}", "maxModelLen: 4096, extraArgs: ['--max-model', '9']}"), "spec.model.extraArgs[0]"),
        (
            ("maxModelLen: 4096}", "maxModelLen: 4096, env: [{name: LD_PRELOAD, value: /x.so}]}"),
            "spec.model.env[0].name",
        ),
        (
            ("path: /mnt/kv-cache}", "path: /mnt/kv-cache, volume: {hostPath: {path: /}}}"),
            "spec.offload.secondaryTiers[0].volume.hostPath.path",
        ),
        (("replicas: 4", "replicas: 4\n  prometheus: {url: 'http://169.254.169.254/'}"), "spec.prometheus.url"),
    ],
    ids=[
        "unknown-gpu-class",
        "unknown-model",
        "bad-quantity",
        "decimal-overflow",
        "float-overflow",
        "infinity",
        "past-1Pi",
        "deadline-past-int32",
        "cpu-past-every-bound",
        "short-alias",
        "abbreviation",
        "loader-env",
        "host-root",
        "metadata-service",
    ],
)
def test_bad_input_exits_2_naming_the_field_without_a_traceback(
    tmp_path: Path, edit: tuple[str, str], path: str
) -> None:
    result = plan(tmp_path, POLICY.replace(*edit))
    assert result.exit_code == 2
    assert f"{path}:" in result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.output


def test_admin_leave_given_on_the_command_line_is_judged_as_the_operator_judges_it(tmp_path: Path) -> None:
    text = POLICY.replace("path: /mnt/kv-cache}", "path: /mnt/kv-cache, volume: {hostPath: {path: /mnt/nvme/kv}}}")
    assert plan(tmp_path, text).exit_code == 2
    assert plan(tmp_path, text, "--allowed-host-path", "/mnt/nvme").exit_code == 0
    refused = plan(tmp_path, text, "--allowed-host-path", "/mnt/nvme", "--allowed-image", "registry.example.com/*")
    assert refused.exit_code == 2
    assert "spec.model.image: docker.io/vllm/vllm-openai is not among the images" in refused.stderr


@pytest.mark.parametrize(
    ("content", "complaint"),
    [
        (b"apiVersion: v1\nkind: \xff\xfe KVOffloadPolicy\n", "not UTF-8 text (byte 21 is 0xff)"),
        (b"a: " + b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b"# " + b"x" * (4 * 1024 * 1024), "larger than 3 MiB"),
    ],
    ids=["not-utf8", "nested-100000-deep", "4-MiB"],
)
def test_a_file_that_is_no_policy_exits_2_without_a_traceback(tmp_path: Path, content: bytes, complaint: str) -> None:
    path = tmp_path / "policy.yaml"
    path.write_bytes(content)
    result = CliRunner().invoke(main, ["plan", str(path)])
    assert result.exit_code == 2, result.output
    assert f"{path}: invalid KVOffloadPolicy (1 error):\n  - (file): {complaint}" in result.stderr
    assert "Traceback" not in result.output


def test_an_endless_file_is_read_only_as_far_as_the_bound() -> None:
    result = CliRunner().invoke(main, ["plan", "/dev/zero"])
    assert result.exit_code == 2
    assert "(file): larger than 3 MiB" in result.stderr


# --- economics: does a CPU-tier hit beat recompute on this GPU class? -------------------------


def economics_of(tmp_path: Path, model: str, gpu_class: str, *args: str) -> dict[str, object]:
    text = POLICY.replace("Qwen/Qwen3-0.6B", model).replace("nvidia-h100-80gb", gpu_class)
    result = plan(tmp_path, text, "-o", "json", *args)
    assert result.exit_code == 0, result.output
    levels = json.loads(result.stdout)["levels"]
    assert "economics" not in levels[0]  # gpu-only: no CPU tier, nothing to price
    with_cpu = [level["economics"] for level in levels if level["cpuBytes"] is not None]
    assert with_cpu
    assert all(e == with_cpu[0] for e in with_cpu)
    economics: dict[str, object] = with_cpu[0]
    return economics


def test_plan_prices_restore_against_recompute_with_the_measured_h200_profile(tmp_path: Path) -> None:
    economics = economics_of(tmp_path, "Qwen/Qwen3-8B", "nvidia-h200-141gb")
    assert economics["profile"] == {"name": "nvidia-h200-141gb", "kind": "measured"}
    assert economics["promptTokens"] == 1480
    recompute, restore = economics["recomputeMs"], economics["restoreMs"]
    assert isinstance(recompute, float)
    assert isinstance(restore, float)
    assert economics["ratio"] == pytest.approx(recompute / restore, rel=0.01)


def test_offload_pays_more_as_the_model_grows_on_the_h200(tmp_path: Path) -> None:
    ratios = [
        economics_of(tmp_path, model, "nvidia-h200-141gb")["ratio"]
        for model in ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-8B", "Qwen/Qwen3-32B")
    ]
    assert ratios == sorted(ratios)
    assert ratios[0] > 1  # even the smallest model restores faster than it recomputes


def test_other_gpu_classes_are_priced_with_an_estimated_profile(tmp_path: Path) -> None:
    economics = economics_of(tmp_path, "Qwen/Qwen3-8B", "nvidia-l4")
    assert economics["profile"] == {"name": "nvidia-l4", "kind": "estimated"}


def test_a_longer_prompt_is_priced_when_asked(tmp_path: Path) -> None:
    short = economics_of(tmp_path, "Qwen/Qwen3-8B", "nvidia-h200-141gb")
    long = economics_of(tmp_path, "Qwen/Qwen3-8B", "nvidia-h200-141gb", "--prompt-tokens", "8192")
    assert long["promptTokens"] == 8192
    assert long["restoreMs"] > short["restoreMs"]  # type: ignore[operator]


def test_a_model_the_profile_has_not_measured_is_not_priced_and_says_why(tmp_path: Path) -> None:
    text = POLICY.replace("Qwen/Qwen3-0.6B", "meta-llama/Llama-3.1-8B-Instruct")
    result = plan(tmp_path, text)
    assert result.exit_code == 0, result.output
    assert "break-even: not priced: profile nvidia-h100-80gb has no eager prefill curve" in result.stdout


CUSTOM = """
  analysis:
    metrics:
      - name: abortShare
        max: 0.01
        query: 'sum(rate(vllm:request_success_total{{ {{{{ selector }}}}, finished_reason="abort"}}[{{{{ window }}}}]))'
      - name: waiting
        max: 5
        query: 'sum(rate(vllm:num_requests_waiting{{ {{{{ selector }}}} }}))'
  prometheus: {{url: "{url}"}}
"""


def test_plan_refuses_a_custom_query_that_is_not_promql_naming_its_field_and_asks_no_prometheus(
    tmp_path: Path,
) -> None:
    with Receiver() as recorder:  # the policy's Prometheus: nothing may reach it
        url = recorder.url.removesuffix("/hook")
        result = plan(tmp_path, POLICY + CUSTOM.format(url=url), "--prometheus-allow-private")
        lines = CUSTOM.format(url=url).splitlines(keepends=True)
        waiting = next(i for i, line in enumerate(lines) if "name: waiting" in line)
        fine = "".join(lines[:waiting] + lines[waiting + 3 :])  # abortShare and the Prometheus, not the broken one
        good = plan(tmp_path, POLICY + fine, "--prometheus-allow-private")
    assert result.exit_code == 2, result.output
    assert "spec.analysis.metrics[1].query" in result.stderr
    assert "not PromQL: expected type matrix in call to function 'rate', got vector" in result.stderr
    assert "spec.analysis.metrics[0]" not in result.stderr
    assert "Traceback" not in result.output
    assert good.exit_code == 0, good.output
    assert recorder.requests == []
