# SPDX-FileCopyrightText: Copyright (c) 2026 NVIDIA CORPORATION & AFFILIATES. All rights reserved.
# SPDX-License-Identifier: Apache-2.0
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
# http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

# [kvoffload excerpt] left out: the imports and everything up to the module-level defaults below.
# CLI/API defaults are sourced from the TorchLlmArgs field defaults so they stay
# in lock-step with the args class and can't drift.
_LLM_ARGS_FIELDS = TorchLlmArgs.model_fields
_MISSING_CONFIG_OVERRIDE = object()


# [kvoffload excerpt] left out: get_llm_args through launch_visual_gen_server.
@click.command("serve")
@click.argument("model", type=str)
@stability_option(
    "--tokenizer",
    type=str,
    default=None,
    help="Path or name of the tokenizer. When using the PyTorch backend, "
    "this replaces the default HuggingFace tokenizer.",
    status="beta")
@stability_option(
    "--custom_tokenizer",
    type=str,
    default=None,
    help=
    "Custom tokenizer type: alias (e.g., 'deepseek_v32') or Python import path "
    "(e.g., 'tensorrt_llm.tokenizer.deepseek_v32.DeepseekV32Tokenizer').",
    status="prototype")
@stability_option(
    "--post_processor_hook",
    type=str,
    default=None,
    help="Python import path of a user post-processing hook applied after "
    "detokenization and before the per-endpoint response formatter (e.g. "
    "'my_pkg.guardrail.MyPostProcessorHook'). The class must be importable "
    "and picklable, take no constructor arguments, and be callable as "
    "'__call__(chunk) -> verdict' (see tensorrt_llm.executor.postprocessor_hook). "
    "It runs once per output, per streaming chunk, and may rewrite, "
    "suppress, or terminate the output; it owns its own per-request state.",
    status="prototype")
@stability_option("--host",
                  type=str,
                  default="localhost",
                  help="Hostname of the server.",
                  status="beta")
@stability_option("--port",
                  type=int,
                  default=8000,
                  help="Port of the server.",
                  status="beta")
@stability_option(
    "--backend",
    type=click.Choice(["pytorch", "_autodeploy"]),
    default="pytorch",
    help="The backend to use to serve the model. Default is pytorch backend. "
    "Note: the '_autodeploy' backend is deprecated and will be discontinued "
    "in a future release; please use the 'pytorch' backend instead.",
    status="deprecated")
@stability_option(
    "--generation-config",
    type=click.Choice(["auto", "trtllm"]),
    default=_LLM_ARGS_FIELDS["generation_config"].default,
    help="Sampling defaults source. 'auto' loads supported values from the "
    "model's generation_config.json; 'trtllm' uses TRT-LLM defaults.",
    status="prototype")
@stability_option("--custom_module_dirs",
                  type=click.Path(exists=True,
                                  readable=True,
                                  path_type=Path,
                                  resolve_path=True),
                  default=None,
                  multiple=True,
                  help="Paths to custom module directories to import.",
                  status="prototype")
@stability_option('--log_level',
                  type=click.Choice(severity_map.keys()),
                  default='info',
                  help="The logging level.",
                  status="beta")
@stability_option("--max_beam_width",
                  type=int,
                  default=_LLM_ARGS_FIELDS["max_beam_width"].default,
                  help="Maximum number of beams for beam search decoding.",
                  status="beta")
@stability_option(
    "--max_batch_size",
    type=int,
    default=_LLM_ARGS_FIELDS["max_batch_size"].default,
    help="Maximum number of requests that the engine can schedule.",
    status="beta")
@stability_option(
    "--max_num_tokens",
    type=int,
    default=_LLM_ARGS_FIELDS["max_num_tokens"].default,
    help=
    "Maximum number of batched input tokens after padding is removed in each batch.",
    status="beta")
@stability_option(
    "--max_seq_len",
    type=int,
    default=None,
    help="Maximum total length of one request, including prompt and outputs. "
    "If unspecified, the value is deduced from the model config.",
    status="beta")
@stability_option("--tensor_parallel_size",
                  "--tp_size",
                  type=int,
                  default=1,
                  help='Tensor parallelism size.',
                  status='beta')
@stability_option("--pipeline_parallel_size",
                  "--pp_size",
                  type=int,
                  default=1,
                  help='Pipeline parallelism size.',
                  status='beta')
@stability_option("--context_parallel_size",
                  "--cp_size",
                  type=int,
                  default=1,
                  help='Context parallelism size.',
                  status='beta')
@stability_option("--moe_expert_parallel_size",
                  "--ep_size",
                  type=int,
                  default=None,
                  help="expert parallelism size",
                  status="beta")
@stability_option(
    "--moe_cluster_parallel_size",
    "--cluster_size",
    type=int,
    default=None,
    help="[Deprecated] Expert cluster parallelism size. "
    "This option is no longer supported and will be removed in a future release.",
    status="deprecated")
@stability_option(
    "--gpus_per_node",
    type=int,
    default=None,
    help=
    "Number of GPUs per node. Default to None, and it will be detected automatically.",
    status="beta")
@stability_option("--free_gpu_memory_fraction",
                  "--kv_cache_free_gpu_memory_fraction",
                  type=float,
                  default=0.9,
                  help="Free GPU memory fraction reserved for KV Cache, "
                  "after allocating model weights and buffers.",
                  status="beta")
@stability_option(
    "--kv_cache_dtype",
    type=click.Choice(("auto", "fp8", "nvfp4")),
    default="auto",
    help="KV cache quantization dtype for PyTorch backend. "
    "'auto' uses checkpoint/model metadata; explicit values force override.",
    status="prototype")
@stability_option("--num_postprocess_workers",
                  type=int,
                  default=0,
                  help="Number of workers to postprocess raw responses "
                  "to comply with OpenAI protocol.",
                  status="prototype")
@stability_option("--num_serve_frontends",
                  type=click.IntRange(min=1, max=MAX_NUM_FRONTENDS),
                  default=1,
                  help="Number of HTTP frontend processes serving one "
                  "executor; values > 1 share the serving port via "
                  "SO_REUSEPORT (classic IPC executor path only).",
                  status="prototype")
@stability_option("--num_input_processor_workers",
                  type=click.IntRange(min=1),
                  default=8,
                  help="Size of the dedicated thread pool that runs the HF "
                  "input processor (multimodal preprocess) on the chat "
                  "and completion endpoints.",
                  status="prototype")
@stability_option("--num_media_load_workers",
                  type=click.IntRange(min=1),
                  default=8,
                  help="Size of the dedicated thread pool that decodes media "
                  "payloads (image / video / audio) for multimodal "
                  "requests.",
                  status="prototype")
@stability_option("--trust_remote_code",
                  is_flag=True,
                  default=False,
                  help="Flag for HF transformers.",
                  status="beta")
@stability_option("--hf_revision",
                  "--revision",
                  "revision",
                  type=str,
                  default=None,
                  help="The revision to use for the HuggingFace model "
                  "(branch name, tag name, or commit id). "
                  "Prefer --hf_revision over --revision.",
                  status="beta")
@stability_option(
    "--config",
    "--extra_llm_api_options",
    "extra_llm_api_options",
    type=str,
    default=None,
    help="Path to a YAML configuration file. Explicit CLI flags take precedence "
    "over values in this file, while --set overrides both. Can be specified "
    "as either --config or --extra_llm_api_options.",
    status="prototype")
@stability_option(
    "--set",
    "config_overrides",
    type=str,
    multiple=True,
    help="Override a canonical LlmArgs path as PATH=YAML_VALUE. Repeatable; "
    "applied after --config and dedicated CLI flags. Not supported for "
    "startup, telemetry, environment, server-only, or VisualGen settings.",
    status="prototype")
@stability_option("--reasoning_parser",
                  type=click.Choice(["auto"] +
                                    list(ReasoningParserFactory.keys())),
                  default=None,
                  help="Specify the parser for reasoning models. "
                  "Use 'auto' to automatically select based on the model.",
                  status="prototype")
@stability_option("--tool_parser",
                  type=click.Choice(["auto"] +
                                    list(ToolParserFactory.parsers.keys())),
                  default=None,
                  help="Specify the parser for tool models. "
                  "Use 'auto' to automatically select based on the model.",
                  status="prototype")
@stability_option("--metadata_server_config_file",
                  type=str,
                  default=None,
                  help="Path to metadata server config file",
                  status="prototype")
@stability_option(
    "--server_role",
    type=str,
    default=None,
    help="Server role for disaggregated serving. "
    "CONTEXT=prefill (prompt processing), GENERATION=decode (token generation), "
    "MM_ENCODER=multimodal encoder, VISUAL_GEN=visual generation. "
    "Required when using service registry.",
    status="prototype")
@stability_option("--otlp_traces_endpoint",
                  type=str,
                  default=None,
                  help="Target URL to which OpenTelemetry traces will be sent.",
                  status="prototype")
@stability_option(
    "--telemetry/--no-telemetry",
    default=True,
    help="Enable or disable anonymous usage telemetry collection.",
    status="beta")
@stability_option("--disagg_cluster_uri",
                  type=str,
                  default=None,
                  help="URI of the disaggregated cluster.",
                  status="prototype")
@stability_option("--enable_chunked_prefill",
                  is_flag=True,
                  default=False,
                  help="Enable chunked prefill",
                  status="prototype")
@stability_option("--enable_attention_dp",
                  is_flag=True,
                  default=False,
                  help="Enable attention data parallel.",
                  status="beta")
@stability_option("--media_io_kwargs",
                  type=str,
                  default=None,
                  help="Keyword arguments for media I/O as a JSON string. "
                  "Keys are modality names (\"video\", \"image\", \"audio\") "
                  "whose values are dicts of keyword arguments forwarded to "
                  "the corresponding loader. "
                  "Example: '{\"video\": {\"extract_audio\": true, "
                  "\"num_frames\": 16}}' to enable audio extraction from "
                  "video files.",
                  status="prototype")
@stability_option("--video_pruning_rate",
                  type=float,
                  default=None,
                  help="Pruning rate for video frames in multimodal models. "
                  "Applied by Efficient Video Sampling (EVS). "
                  "None disables EVS, values in [0, 1) enable pruning.",
                  status="prototype")
@stability_option("--chat_template",
                  type=str,
                  default=None,
                  help="Specify a custom chat template. "
                  "Can be a file path or one-liner template string",
                  status="prototype")
@stability_option(
    "--allow_request_chat_template",
    is_flag=True,
    default=False,
    help="Allow clients to supply per-request chat_template values. "
    "Only enable this for trusted clients.",
    status="prototype")
@stability_option(
    "--middleware",
    multiple=True,
    type=str,
    help="FastAPI middleware import path to add to the server app. "
    "Can be specified multiple times. Each value must point to either "
    "a middleware class or an async HTTP middleware function.",
    status="prototype")
@stability_option(
    "--grpc",
    is_flag=True,
    default=False,
    help="Run the selected gRPC protocol instead of the OpenAI HTTP server.",
    status="prototype")
@stability_option("--grpc-protocol",
                  type=click.Choice(["smg", "openengine"]),
                  default="smg",
                  help="Protocol used when --grpc is enabled.",
                  status="prototype")
@stability_option(
    "--served_model_name",
    type=str,
    default=None,
    help="The model name used in the API. If not specified, the model path is "
    "used as the model name. This is useful when the model path is long or "
    "when you want to expose a custom name to clients.",
    status="prototype")
@stability_option(
    "--enable_visual_gen",
    is_flag=True,
    default=False,
    help="Enable VisualGen runtime for model checkpoints that support both LLM "
    "and Visual Generation. Not required if --visual_gen_args specified "
    "or the model supports Visual Generation only.",
    status="prototype")
@stability_option("--visual_gen_args",
                  type=str,
                  default=None,
                  help="Path to a YAML file with VisualGen engine args.",
                  status="prototype")
@stability_option(
    "--agent_percentage",
    type=float,
    default=0.0,
    help="The percentage of agent requests to schedule. Defaults to 0.0. "
    "Should be between 0.0 and 1.0.",
    status="prototype")
@stability_option(
    "--agent_types",
    type=str,
    default=None,
    help=
    "Types of agents to schedule. Now Only Support Open Deep Research agent.",
    status="prototype")
@stability_option(
    "--report_addr",
    type=str,
    default=None,
    help="Write the host:port this server actually bound to this file, "
    "atomically, once the socket is bound. Lets --port 0 be used and have the "
    "launcher read the kernel-assigned port back instead of reserving one up "
    "front.",
    status="prototype")
def serve(
    model: str,
    tokenizer: Optional[str],
    custom_tokenizer: Optional[str],
    post_processor_hook: Optional[str],
    host: str,
    port: int,
    log_level: str,
    backend: str,
    generation_config: str,
    max_beam_width: int,
    max_batch_size: int,
    max_num_tokens: int,
    max_seq_len: int,
    tensor_parallel_size: int,
    pipeline_parallel_size: int,
    context_parallel_size: int,
    moe_expert_parallel_size: Optional[int],
    moe_cluster_parallel_size: Optional[int],
    gpus_per_node: Optional[int],
    free_gpu_memory_fraction: float,
    kv_cache_dtype: str,
    num_postprocess_workers: int,
    num_serve_frontends: int,
    num_input_processor_workers: int,
    num_media_load_workers: int,
    trust_remote_code: bool,
    revision: Optional[str],
    extra_llm_api_options: Optional[str],
    config_overrides: tuple[str, ...],
    reasoning_parser: Optional[str],
    tool_parser: Optional[str],
    metadata_server_config_file: Optional[str],
    server_role: Optional[str],
    otlp_traces_endpoint: Optional[str],
    enable_chunked_prefill: bool,
    enable_attention_dp: bool,
    disagg_cluster_uri: Optional[str],
    media_io_kwargs: Optional[str],
    agent_percentage: float,
    agent_types: Optional[str],
    video_pruning_rate: Optional[float],
    telemetry: bool,
    custom_module_dirs: list[Path],
    chat_template: Optional[str],
    allow_request_chat_template: bool,
    middleware: tuple[str, ...],
    grpc: bool,
    grpc_protocol: str,
    enable_visual_gen: bool,
    served_model_name: Optional[str],
    visual_gen_args: Optional[str],
    report_addr: Optional[str],
) -> None:
    """Running an OpenAI API compatible server

    MODEL: model name or Hugging Face checkpoint path
    """
# [kvoffload excerpt] serve's body goes on from logger.set_level(log_level), left out: the YAML named by
# --config/--extra_llm_api_options is read with yaml.safe_load, must be a mapping, and is merged over the
# CLI-derived llm_args (llm_args.py update_llm_args_with_extra_dict) before TorchLlmArgs validates it.
