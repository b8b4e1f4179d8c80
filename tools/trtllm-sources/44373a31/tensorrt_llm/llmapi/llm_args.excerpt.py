# SPDX-FileCopyrightText: Copyright (c) 2022-2026 NVIDIA CORPORATION & AFFILIATES. All rights reserved.
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

# [kvoffload excerpt] left out: the imports (StrictBaseModel comes from .utils) and every definition before KvCacheConfig.
@PybindMirror.mirror_pybind_fields(_KvCacheConfig)
class KvCacheConfig(StrictBaseModel, PybindMirror):
    """Configuration for the KV cache."""

    enable_block_reuse: bool = Field(
        default=True, description="Controls if KV cache blocks can be reused for different requests."
    )
    max_tokens: Optional[int] = Field(
        default=None,
        description="The maximum number of tokens that should be stored in the KV cache. If both `max_tokens` and `free_gpu_memory_fraction` are specified, memory corresponding to the minimum will be used.",
    )
    max_attention_window: Optional[List[int]] = Field(
        default=None,
        min_length=1,
        description="Size of the attention window for each sequence. Only the last tokens will be stored in the KV cache. If the number of elements in `max_attention_window` is less than the number of layers, `max_attention_window` will be repeated multiple times to the number of layers.",
    )
    sink_token_length: Optional[int] = Field(
        default=None,
        description="Deprecated and ignored on the PyTorch backend. StreamingLLM is not supported "
        "by the PyTorch attention kernels — any non-None value has no effect and "
        "will be silently dropped before reaching the executor.",
        deprecated=True,
    )
    free_gpu_memory_fraction: Optional[float] = Field(
        default=0.9,
        ge=0,
        le=1,
        description="The fraction of GPU memory fraction that should be allocated for the KV cache. Default is 90%. If both `max_tokens` and `free_gpu_memory_fraction` are specified, memory corresponding to the minimum will be used.",
    )
    host_cache_size: Optional[int] = Field(
        default=None,
        description="Size of the host cache in bytes. If both `max_tokens` and `host_cache_size` are specified, memory corresponding to the minimum will be used.",
    )
    disk_cache_size: Optional[NonNegativeInt] = Field(
        default=None,
        description="Size of the disk cache in bytes. Only used by KV cache manager v2 in the PyTorch backend.",
    )
    disk_cache_path: Optional[str] = Field(
        default=None,
        description="Directory used for disk KV cache files. Must be set when `disk_cache_size` is positive.",
    )
    cross_kv_cache_fraction: Optional[float] = Field(
        default=None,
        description="The fraction of the KV Cache memory should be reserved for cross attention. If set to p, self attention will use 1-p of KV Cache memory and cross attention will use p of KV Cache memory. Defaults to None (unset); must be set when using an encoder-decoder model and must not be set otherwise.",
    )
    secondary_offload_min_priority: Optional[int] = Field(
        default=None,
        description="Only blocks with priority > secondary_offload_min_priority can be offloaded to secondary memory.",
    )
    event_buffer_max_size: int = Field(
        default=0, description="Maximum size of the event buffer. If set to 0, the event buffer will not be used."
    )
    attention_dp_events_gather_period_ms: int = Field(
        default=5, description="The period in milliseconds to gather attention DP events across ranks."
    )
    # This is a pure python field, not a pybind field. It is only for the Pytorch backend.
    kv_events_config: Optional[KVEventsConfig] = Field(
        default=None,
        status="prototype",
        description="Streaming (push-based) KV cache event publishing (KV cache manager V2 only). When set, "
        "each rank publishes its own events directly (e.g. over ZeroMQ) instead "
        "of the buffered event_buffer_max_size gather/poll path.",
    )
    enable_partial_reuse: bool = Field(
        default=True, description="Whether blocks that are only partially matched can be reused."
    )
    copy_on_partial_reuse: bool = Field(
        default=True, description="Whether partially matched blocks that are in use can be reused after copying them."
    )
    use_uvm: bool = Field(default=False, description="Whether to use UVM for the KV cache.")
    max_gpu_total_bytes: NonNegativeInt = Field(
        default=0,
        description="The maximum size in bytes of GPU memory that can be allocated for the KV cache. If both `max_gpu_total_bytes` and `free_gpu_memory_fraction` are specified, memory corresponding to the minimum will be allocated.",
    )

    # This is a pure python field, not a pybind field. It is only for the Pytorch backend.
    iteration_stats_interval: PositiveInt = Field(
        default=1,
        description="How often (in iterations) to collect per-iteration KV cache statistics. "
        "A value of 1 means every iteration; a value of N means every Nth iteration. "
        "Between collections, the C++ deltas accumulate, so the reported deltas cover N iterations.",
    )

    # This is a pure python field, not a pybind field. It is only for the Pytorch backend.
    dtype: str = Field(
        default="auto",
        description="The data type for the KV cache. 'auto' (default) leaves the checkpoint's "
        "own KV-cache quantization metadata untouched (quant_config.kv_cache_quant_algo "
        "is inherited as-is); 'fp8', 'fp8_ds_mla', or 'nvfp4' override it explicitly. "
        "'fp8_ds_mla' selects the packed FP8 cache used by sparse MLA on SM90/SM120/SM121. "
        "Resolved at "
        "LLM-construction time, including when set via trtllm-serve "
        "--extra_llm_api_options.",
        telemetry=TelemetryField.categorical("auto", "float16", "bfloat16", "float32", "fp8", "fp8_ds_mla", "nvfp4"),
    )

    # This is a pure python field, not a pybind field. It is only for the Pytorch backend.
    mamba_ssm_cache_dtype: Literal["auto", "float16", "bfloat16", "float32"] = Field(
        default="auto",
        description="The data type to use for the Mamba SSM cache. If set to 'auto', the data type will be inferred from the model config.",
    )

    # This is a pure python field, not a pybind field. It is only for the Pytorch backend.
    mamba_ssm_stochastic_rounding: bool = Field(
        default=False,
        description="Enable stochastic rounding for Mamba SSM state updates. Only applicable with float16 cache dtype.",
    )

    # This is a pure python field, not a pybind field. It is only for the Pytorch backend.
    mamba_ssm_philox_rounds: int = Field(
        default=10,
        ge=1,
        description="Number of Philox rounds for stochastic rounding PRNG. Higher values give better randomness "
        "but increase compute cost. Only used when mamba_ssm_stochastic_rounding is enabled.",
    )

    tokens_per_block: int = Field(default=32, description="The number of tokens per block.")

    # This is a pure python field, not a pybind field. It is only for the Pytorch backend.
    mamba_state_cache_interval: Optional[NonNegativeInt] = Field(
        default=None,
        status="deprecated",
        telemetry=False,
        exclude=True,
        description="Deprecated alias for mamba_state_config.periodic_snapshot_interval.",
    )

    # This is a pure python field, not a pybind field. It is only for the Pytorch backend.
    mamba_state_config: MambaStateConfig = Field(
        default_factory=MambaStateConfig, description="Configuration for reusable Mamba state snapshots."
    )

    use_kv_cache_manager_v2: bool | Literal["auto"] = Field(
        default="auto",
        status="prototype",
        description="Whether to use the KV cache manager v2 (experimental). 'auto' uses "
        "the model-specific preference and falls back to False when the model "
        "does not declare one.",
    )

    # This is a pure python field, not a pybind field. It is only for the Pytorch backend.
    enable_swa_scratch_reuse: bool = Field(
        default=False,
        status="prototype",
        description="Whether KV cache manager v2 uses SWA scratch reuse during prefill.",
    )

    kv_cache_event_hash_algo: Literal["auto", "v1_block_key", "v2_sha256", "v2_sha256_64"] = Field(
        default="auto",
        status="prototype",
        description="The block hash algorithm used by KV cache manager events. "
        "'auto' uses the native hash for each KV cache manager. "
        "Explicit V2 hash choices are ignored with a warning by the V1 "
        "KV cache manager.",
    )

    max_util_for_resume: float = Field(
        default=0.95,
        gt=0,
        le=1,
        status="prototype",
        description="The maximum utilization of the KV cache for resume. Default is 95%. Only used when using KV cache manager v2 (experimental).",
    )

    enable_kv_pool_rebalance: bool = Field(
        default=False,
        status="prototype",
        description="Opt in to the KVCacheManagerV2 auto-tuner (``adjust()``) for "
        "rebalancing pool-group ratios between iterations. When True the "
        "PyExecutor calls ``adjust()`` opportunistically; the auto-tuner "
        "itself remains gated by V2's internal 2000-sample / 120s cooldown. "
        "When False (default) the rebalance hook is skipped entirely and "
        "pool ratios remain at their warmup-derived values. Beta: enable at "
        "your own risk. Only used when using KV cache manager v2 "
        "(experimental). This option is incompatible with dtype='fp8_ds_mla'.",
    )

    disk_prefetch_num_reqs: int = Field(
        default=0,
        ge=0,
        description="Number of queued context requests to prefetch disk-tier KV cache blocks to host for. "
        "Set to 0 to disable prefetch. Only effective with KV cache manager v2 and block reuse enabled.",
    )

    # This is a pure python field, not a pybind field. It is only for the Pytorch backend.
    fp8_context_mla_kv_len_cap: Optional[int] = Field(
        default=None,
        status="prototype",
        description="Override, in tokens, for the max summed attended-KV length (total_kv_len) per forward step that "
        "the fp8 context-MLA attention workspace is reserved and scheduled for. Only affects fp8 "
        "context-MLA models (e.g. DeepSeek / Kimi with an fp8 KV cache). None (default) reserves for the "
        "never-stall worst case min(max_batch_size, max_num_tokens) * max_seq_len. A smaller value reserves "
        "less workspace (freeing KV cache) and defers context requests whose summed attended KV would "
        "exceed it; it is floored at max_seq_len and capped at the worst case. Safe at any value -- the "
        "scheduler enforces it -- trading prefill batching under heavy reuse for KV cache capacity.",
    )

    # This is a pure python field, not a pybind field. It is only for the Pytorch backend.
    pool_ratio: Optional[List[float]] = Field(
        default=None,
        min_length=1,
        status="prototype",
        description="Initial hot-tier byte ratios by layer group for KV cache "
        "manager v2. Values map to KVCacheManagerV2 layer-group ID order and "
        "must sum to 1.0. Cold tiers preserve the implied slot-count ratios. Hybrid Mamba "
        "models and DeepSeek-V4 use this directly, so avg_seq_len does not take "
        "effect when this is set.",
    )

    # This is a pure python field, not a pybind field. It is only for the Pytorch backend.
    avg_seq_len: Optional[PositiveInt] = Field(
        default=None,
        status="prototype",
        description="Average total sequence length of the serving workload, used to build the "
        "KV cache manager v2 typical step for hybrid Mamba models and DeepSeek-V4. "
        "Hybrid Mamba models warn and fall back to half of max_seq_len when this is "
        "unset. This does not take effect when pool_ratio is set.",
    )

    # This is a pure python field, not a pybind field. It is only for the Pytorch backend.
    block_reuse_config: BlockReuseConfig = Field(
        default_factory=BlockReuseConfig,
        status="prototype",
        description="KV cache manager v2 configuration for block reuse policies.",
    )

    def _to_pybind(self):
        config = _KvCacheConfig(
            enable_block_reuse=self.enable_block_reuse,
            max_tokens=self.max_tokens,
            max_attention_window=self.max_attention_window,
            free_gpu_memory_fraction=self.free_gpu_memory_fraction,
            host_cache_size=self.host_cache_size,
            cross_kv_cache_fraction=self.cross_kv_cache_fraction,
            secondary_offload_min_priority=self.secondary_offload_min_priority,
            event_buffer_max_size=self.event_buffer_max_size,
            enable_partial_reuse=self.enable_partial_reuse,
            copy_on_partial_reuse=self.copy_on_partial_reuse,
            use_uvm=self.use_uvm,
            attention_dp_events_gather_period_ms=self.attention_dp_events_gather_period_ms,
            max_gpu_total_bytes=self.max_gpu_total_bytes,
        )
        return config

    @field_validator("free_gpu_memory_fraction")
    @classmethod
    def validate_free_gpu_memory_fraction(cls, v: float):
        """Validates that the fraction is between 0.0 and 1.0."""
        if not 0 <= v <= 1:
            raise ValueError("kv_cache_config.free_gpu_memory_fraction must be a float between 0 and 1")
        return v

    @field_validator("cross_kv_cache_fraction")
    @classmethod
    def validate_cross_kv_cache_fraction(cls, v: Optional[float]):
        if v is None:
            return v
        if not 0 <= v <= 1:
            raise ValueError("kv_cache_config.cross_kv_cache_fraction must be a float between 0 and 1")
        return v

    @field_validator("dtype")
    @classmethod
    def validate_dtype(cls, v: str):
        v = v.lower()
        if v in ("auto", "fp8", "fp8_ds_mla", "nvfp4") or v in _str_to_torch_dtype_dict.keys():
            return v

        raise ValueError(
            'kv_cache_config.dtype must be one of "auto", "fp8", "fp8_ds_mla", "nvfp4", or valid torch.dtype string'
        )

    @model_validator(mode="after")
    def reject_fp8_ds_mla_pool_rebalance(self) -> "KvCacheConfig":
        """Reject resizing while packed sparse-MLA pool views are fixed."""
        if self.dtype == "fp8_ds_mla" and self.enable_kv_pool_rebalance:
            raise ValueError(
                "kv_cache_config.dtype='fp8_ds_mla' is incompatible with "
                "kv_cache_config.enable_kv_pool_rebalance=True because packed "
                "sparse-MLA pool views are fixed at cache-manager construction time."
            )
        return self

    @field_validator("max_gpu_total_bytes")
    @classmethod
    def validate_max_gpu_total_bytes(cls, v: int):
        if v < 0:
            raise ValueError("kv_cache_config.max_gpu_total_bytes must be non-negative")
        return v

    @model_validator(mode="after")
    def migrate_legacy_mamba_interval(self) -> "KvCacheConfig":
        """Copy the deprecated Mamba interval into its nested replacement."""
        if self.mamba_state_cache_interval is None:
            return self
        if "periodic_snapshot_interval" in self.mamba_state_config.model_fields_set:
            raise ValueError(
                "Cannot set both "
                "'kv_cache_config.mamba_state_cache_interval' and "
                "'kv_cache_config.mamba_state_config."
                "periodic_snapshot_interval'."
            )
        logger.warning(
            "'kv_cache_config.mamba_state_cache_interval' is deprecated; use "
            "'kv_cache_config.mamba_state_config."
            "periodic_snapshot_interval' instead."
        )
        self.mamba_state_config = self.mamba_state_config.model_copy(
            update={"periodic_snapshot_interval": self.mamba_state_cache_interval}
        )
        return self

    @model_validator(mode="after")
    def disable_periodic_mamba_snapshots_for_conversations(self) -> "KvCacheConfig":
        """Use only explicit stable boundaries for conversation reuse."""
        if (
            self.block_reuse_config.policy == "per_conversation"
            and self.mamba_state_config.periodic_snapshot_interval != 0
        ):
            interval = self.mamba_state_config.periodic_snapshot_interval
            logger.warning(
                f"'kv_cache_config.mamba_state_config.periodic_snapshot_interval={interval}' "
                "is ignored because "
                "'kv_cache_config.block_reuse_config.policy=per_conversation' disables "
                "periodic Mamba snapshots; setting it to 0."
            )
            self.mamba_state_config = self.mamba_state_config.model_copy(update={"periodic_snapshot_interval": 0})
        return self

    @model_validator(mode="after")
    def validate_disk_cache_config(self):
        if self.disk_cache_size is not None and self.disk_cache_size > 0:
            if not self.disk_cache_path:
                raise ValueError("kv_cache_config.disk_cache_path must be set when disk_cache_size is positive")
            if not os.path.isdir(self.disk_cache_path):
                raise ValueError(
                    f"kv_cache_config.disk_cache_path {self.disk_cache_path} does not exist or is not a directory"
                )
        return self

    @model_validator(mode="after")
    def validate_mamba_snapshot_offsets(self) -> "KvCacheConfig":
        state_config = self.mamba_state_config
        has_additional_snapshots = bool(
            state_config.additional_snapshot_offsets_from_start or state_config.additional_snapshot_offsets_from_end
        )
        if has_additional_snapshots and self.use_kv_cache_manager_v2 is False:
            raise ValueError(
                "kv_cache_config.mamba_state_config additional snapshot "
                "offsets require kv_cache_config.use_kv_cache_manager_v2=True."
            )
        if state_config.enable_branch_snapshot and self.use_kv_cache_manager_v2 is False:
            raise ValueError(
                "kv_cache_config.mamba_state_config.enable_branch_snapshot "
                "requires kv_cache_config.use_kv_cache_manager_v2=True."
            )
        return self

    @field_validator("max_attention_window")
    @classmethod
    def validate_max_attention_window(cls, v: Optional[List[int]]):
        if v is None:
            return v

        if not isinstance(v, list) or len(v) == 0:
            raise ValueError("kv_cache_config.max_attention_window must be a non-empty list of positive integers")
        for i in v:
            if not isinstance(i, int):
                raise ValueError("kv_cache_config.max_attention_window must contain only integers")
            if i <= 0 and i not in [LinearCacheType.RECURRENT_STATES.value]:
                raise ValueError(
                    "kv_cache_config.max_attention_window values must be positive or LinearCacheType.RECURRENT_STATES.value"
                )
        return v

    @field_validator("pool_ratio")
    @classmethod
    def validate_pool_ratio(cls, v: Optional[List[float]]):
        if v is None:
            return v
        if any(r <= 0 for r in v):
            raise ValueError("kv_cache_config.pool_ratio values must be positive")
        if not math.isclose(sum(v), 1.0, rel_tol=0.0, abs_tol=1e-6):
            raise ValueError("kv_cache_config.pool_ratio values must sum to 1.0")
        return v


# [kvoffload excerpt] left out: ExtendedRuntimePerfKnobConfig through DwdpConfig.
class BaseLlmArgs(StrictBaseModel):
    """Base class for the LLM arguments. It contains all the common arguments."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    # Explicit arguments
    model: Union[str, Path] = Field(
        description="The path to the model checkpoint or the model name from the Hugging Face Hub."
    )

    tokenizer: Optional[Union[str, Path, TokenizerBase, PreTrainedTokenizerBase]] = Field(
        description="The path to the tokenizer checkpoint or the tokenizer name from the Hugging Face Hub.",
        default=None,
    )

    tokenizer_mode: Literal["auto", "slow"] = Field(
        default="auto",
        description="The mode to initialize the tokenizer.",
        json_schema_extra={"type": "Literal['auto', 'slow']"},
    )

    custom_tokenizer: Optional[str] = Field(
        default=None,
        description="Specify a custom tokenizer implementation. Accepts either: "
        "(1) a built-in alias (e.g., 'deepseek_v32'), or "
        "(2) a Python import path (e.g., 'tensorrt_llm.tokenizer.deepseek_v32.DeepseekV32Tokenizer'). "
        "The tokenizer class must implement 'from_pretrained(path, **kwargs)' and the TokenizerBase interface.",
        status="prototype",
    )

    post_processor_hook: Optional[str] = Field(
        default=None,
        description="Python import path of a user post-processing hook applied after "
        "detokenization and before the per-endpoint response formatter (e.g. "
        "'my_pkg.guardrail.MyPostProcessorHook'). The class must be importable and "
        "picklable, take no constructor arguments, and be callable as "
        "'__call__(chunk) -> verdict' (see tensorrt_llm.executor.postprocessor_hook). "
        "It runs once per output, per streaming chunk, and may rewrite, "
        "suppress, or terminate the output; it owns its own per-request state.",
        status="prototype",
    )

    skip_tokenizer_init: bool = Field(default=False, description="Whether to skip the tokenizer initialization.")

    trust_remote_code: bool = Field(default=False, description="Whether to trust the remote code.")

    tensor_parallel_size: int = Field(default=1, description="The tensor parallel size.")

    dtype: str = Field(
        default="auto",
        description="The data type to use for the model. When 'auto' "
        "(default), it is read from the HF config.json ('dtype', or the "
        "deprecated 'torch_dtype'); for composite/VLM configs it falls "
        "back to the nested text_config.dtype. Defaults to bfloat16 if "
        "none is found.",
        telemetry=TelemetryField.categorical("auto", "float16", "bfloat16", "float32"),
    )

    revision: Optional[str] = Field(default=None, description="The revision to use for the model.")

    tokenizer_revision: Optional[str] = Field(default=None, description="The revision to use for the tokenizer.")

    # Below are all remaining arguments

    model_kwargs: Optional[Dict[str, Any]] = Field(
        default=None,
        description="Optional parameters overriding model config defaults. "
        "Precedence: (1) model_kwargs, (2) model config file, (3) model config class defaults. "
        "Unknown keys are ignored",
        status="prototype",
    )

    pipeline_parallel_size: int = Field(default=1, description="The pipeline parallel size.")

    context_parallel_size: int = Field(default=1, description="The context parallel size.")

    gpus_per_node: Optional[int] = Field(
        default=None, description="The number of GPUs per node.", status="beta", validate_default=True
    )

    moe_cluster_parallel_size: Optional[int] = Field(
        default=None, description="The cluster parallel size for MoE model's expert weights.", status="deprecated"
    )

    moe_tensor_parallel_size: Optional[int] = Field(
        default=None, description="The tensor parallel size for MoE model's expert weights."
    )

    moe_expert_parallel_size: Optional[int] = Field(
        default=None, description="The expert parallel size for MoE model's expert weights."
    )

    enable_attention_dp: bool = Field(default=False, description="Enable attention data parallel.", status="beta")

    enable_lm_head_tp_in_adp: bool = Field(
        default=False, description="Enable LM head TP in attention dp.", status="prototype"
    )

    pp_partition: Optional[List[int]] = Field(
        default=None, description="Pipeline parallel partition, a list of each rank's layer number.", status="prototype"
    )

    cp_config: Optional[CpConfig] = Field(default=None, description="Context parallel config.", status="prototype")

    load_format: Literal["auto", "dummy"] = Field(
        default="auto",
        description="The format to load the model.",
        json_schema_extra={"type": "Literal['auto', 'dummy']"},
    )

    # LoRA arguments
    enable_lora: bool = Field(default=False, description="Enable LoRA.")

    lora_config: Optional[LoraConfig] = Field(default=None, description="LoRA configuration for the model.")

    # Several options from ExecutorConfig, expanded here for less hierarchy
    kv_cache_config: KvCacheConfig = Field(default_factory=KvCacheConfig, description="KV cache config.")

    enable_chunked_prefill: bool = Field(default=False, description="Enable chunked prefill.")

    guided_decoding_backend: Optional[Literal["xgrammar", "llguidance"]] = Field(
        default=None, description="Guided decoding backend. llguidance is supported in PyTorch backend only."
    )

    batched_logits_processor: Optional[object] = Field(
        default=None,
        description="Batched logits processor.",
        json_schema_extra={"type": f"Optional[{get_type_repr(BatchedLogitsProcessor)}]"},
    )

    iter_stats_max_iterations: Optional[int] = Field(
        default=None,
        ge=-1,
        description="The maximum number of iterations for iter stats. Set to -1 to keep all iteration stats. "
        "Set to 0 to disable iteration stats in the TensorRT executor.",
        status="prototype",
    )

    request_stats_max_iterations: Optional[int] = Field(
        default=None,
        ge=-1,
        description="The maximum number of iterations for request stats. Set to -1 to keep all request stats. "
        "Set to 0 to disable request stats.",
        status="prototype",
    )

    # A handful of options from PretrainedConfig
    peft_cache_config: Optional[PeftCacheConfig] = Field(
        default=None, description="PEFT cache config.", status="prototype"
    )

    scheduler_config: SchedulerConfig = Field(
        default_factory=SchedulerConfig, description="Scheduler config.", status="prototype"
    )

    cache_transceiver_config: Optional[CacheTransceiverConfig] = Field(
        default=None, description="Cache transceiver config.", status="prototype"
    )

    # Sparse attention config
    sparse_attention_config: Optional[SparseAttentionConfig] = Field(
        default=None, description="Sparse attention config.", status="prototype"
    )

    # KV cache compression config (separate from sparse attention: changes which
    # KV is stored, not the attention computation).
    kv_cache_compression_config: Optional[KvCacheCompressionConfigType] = Field(
        default=None, description="KV-cache compression config; None disables compression.", status="prototype"
    )

    # Speculative decoding parameters
    speculative_config: Optional[SpeculativeConfig] = Field(default=None, description="Speculative decoding config.")

    max_batch_size: Optional[int] = Field(default=2048, description="The maximum batch size.")

    # generation constraints
    max_input_len: Optional[int] = Field(default=1024, description="The maximum input length.")

    max_seq_len: Optional[int] = Field(default=None, description="The maximum sequence length.")

    max_beam_width: Optional[int] = Field(default=1, description="The maximum beam width.")

    max_num_tokens: Optional[int] = Field(default=8192, description="The maximum number of tokens.")

    gather_generation_logits: bool = Field(default=False, description="Gather generation logits.", status="prototype")

    # private fields those are unstable and just for internal use
    num_postprocess_workers: int = Field(
        default=0,
        description="The number of processes used for postprocessing the generated tokens, including detokenization.",
        status="prototype",
    )

    postprocess_tokenizer_dir: Optional[str] = Field(
        default=None, description="The path to the tokenizer directory for postprocessing.", status="prototype"
    )

    num_serve_frontends: int = Field(
        default=1,
        ge=1,
        # = executor.utils.MAX_NUM_FRONTENDS (cannot be imported here);
        # test_multi_frontend_routing pins the two together.
        le=64,
        description="The number of HTTP frontend processes serving one executor. Used by "
        "trtllm-serve: values > 1 run additional attached frontend processes "
        "that share the serving port via SO_REUSEPORT (classic IPC executor "
        "path only).",
        status="prototype",
    )

    reasoning_parser: Optional[str] = Field(
        default=None,
        description="The parser to separate reasoning content from output.",
        status="prototype",
        telemetry=TelemetryField.categorical(
            "auto",
            "deepseek-r1",
            "poolside_v1",
            "laguna",
            "qwen3",
            "qwen3_5",
            "minimax_m2",
            "minimax_m2_append_think",
            "nano-v3",
            "gemma4",
            "kimi_k2",
            "kimi_k25",
        ),
    )

    # TODO[Superjomn]: To deprecate this config.
    decoding_config: Optional[object] = Field(
        default=None,
        description="The decoding config.",
        json_schema_extra={"type": "Optional[tensorrt_llm.llmapi.llm_args.DecodingConfig]"},
        status="deprecated",
        deprecated="Use speculative_config instead.",
    )

    mpi_session: Optional[object] = Field(
        default=None,
        description="The optional MPI session to use for this LLM instance.",
        json_schema_extra={"type": "Optional[MpiSession]"},
        exclude=True,
        alias="_mpi_session",
    )

    otlp_traces_endpoint: Optional[str] = Field(
        default=None,
        description="Target URL to which OpenTelemetry traces will be sent.",
        alias="otlp_traces_endpoint",
        status="prototype",
    )

    backend: Optional[str] = Field(
        default=None,
        description="The backend to use for this LLM instance.",
        exclude_json_schema=True,  # hide from API references
        validate_default=True,
        status="deprecated",
        telemetry=TelemetryField.categorical("pytorch", "_autodeploy"),
    )

    return_perf_metrics: bool = Field(
        default=False,
        description="Allow serving responses to include per-request performance metrics when "
        "the request sets X-TRTLLM-return-metrics: 1.",
        status="prototype",
    )

    perf_metrics_output_dir: Optional[str] = Field(
        default=None,
        description="Directory for per-process performance metrics JSONL "
        "files. Setting this enables collection even when "
        "return_perf_metrics is false.",
        status="prototype",
        telemetry=False,
    )

    perf_metrics_max_requests: NonNegativeInt = Field(
        default=0,
        description="Deprecated compatibility field. Completed per-request metrics are no longer retained in memory.",
        status="deprecated",
    )

    prometheus_metrics_config: Optional[PrometheusMetricsConfig] = Field(
        default=None,
        description="Configuration for Prometheus metrics collection, including custom histogram bucket boundaries.",
        status="prototype",
    )

    enable_energy_metrics: bool = Field(
        default=False,
        description="Enable GPU energy monitoring via NVML. When enabled, the server exposes an /energy_metrics endpoint that reports cumulative GPU energy consumption in joules.",
        status="prototype",
    )

    orchestrator_type: Optional[Literal["rpc", "ray"]] = Field(
        default=None,
        description="The orchestrator type to use. Defaults to None, which uses MPI.",
        status="prototype",
    )

    env_overrides: Optional[Dict[str, str]] = Field(
        default=None,
        description="[EXPERIMENTAL] Environment variable overrides. NOTE: import-time-cached env vars in the code won't update unless the code fetches them from os.environ on demand.",
        status="prototype",
    )

    telemetry_config: TelemetryConfig = Field(
        default_factory=TelemetryConfig,
        description="Telemetry configuration (opt-out, usage context).",
        status="prototype",
    )


# [kvoffload excerpt] BaseLlmArgs goes on with its validators and methods (from coerce_env_overrides_to_str), left out.


class LoadFormat(Enum):
    AUTO = 0
    # Initialize all weights randomly.
    DUMMY = 1
    # Only load the multimodal(vision) encoder weights
    VISION_ONLY = 2
    # Load weights through GPU Memory Service.
    GMS = 3


# [kvoffload excerpt] left out: ModelExpressConfig through TORCH_LLMARGS_REMOVED_ARGS.
class TorchLlmArgs(BaseLlmArgs):
    # PyTorch backend specific configurations
    generation_config: Literal["auto", "trtllm"] = Field(
        default="trtllm",
        description=
        "Controls whether sampling defaults are loaded from the model's "
        "generation_config.json. 'auto' applies supported values when the "
        "request does not specify them; 'trtllm' preserves TRT-LLM defaults. "
        "Precedence is request values, generation_config.json values, then "
        "TRT-LLM defaults.",
        status="prototype",
        json_schema_extra={"type": "Literal['auto', 'trtllm']"})

    garbage_collection_gen0_threshold: int = Field(
        default=20000,
        description=
        "Threshold for Python garbage collection of generation 0 objects. "
        "Lower values trigger more frequent garbage collection.",
        status="beta")

    cuda_graph_config: Optional[CudaGraphConfigType] = Field(
        default_factory=CudaGraphConfig,
        description="CUDA graph config. If true, use CUDA graphs for decoding. \
        CUDA graphs are only created for the batch sizes in cuda_graph_config.batch_sizes, \
        and are enabled for batches that consist of decoding requests *only* \
        (the reason is that it's hard to capture a single graph with prefill requests \
        since the input shapes are a function of the sequence lengths).\
         Note that each CUDA graph can use up to 200 MB of extra memory.",
        status="beta")

    encoder_cuda_graph_config: Optional[EncodeCudaGraphConfig] = Field(
        default=None,
        description=(
            "CUDA graph configuration for the encoder forward pass of an "
            "encoder-decoder model. Use `cuda_graph_config` for the decoder "
            "and this field for the encoder. Encoder CUDA graphs require "
            "`encoder_max_batch_size` to be set."),
        status="prototype")

    enable_encoder_decoder_mixed_cuda_graph: bool = Field(
        default=True,
        description=(
            "Enable the mixed-batch CUDA graph performance optimization for "
            "encoder-decoder models. The graph handles decoder iterations "
            "containing both context and generation requests. It is enabled "
            "by default when both `cuda_graph_config` and "
            "`encoder_cuda_graph_config` produce usable graph shapes."),
        status="prototype")

    @field_validator('cuda_graph_config', mode='before')
    @classmethod
    def infer_cuda_graph_config_mode(cls, v):
        if isinstance(v, dict) and "mode" not in v:
            encoder_keys = {
                "num_tokens", "max_num_token", "seq_lens", "max_seq_len"
            }
            v = dict(v)
            v["mode"] = "encode" if any(k in v and v[k] not in (None, 0)
                                        for k in encoder_keys) else "decode"
        return v

    multimodal_config: MultimodalConfig = Field(
        default_factory=MultimodalConfig,
        description="Multimodal model configuration.",
        status="prototype")

    @field_validator('multimodal_config', mode='before')
    @classmethod
    def init_multimodal_config(cls, v):
        # The field is non-Optional, but callers (e.g. the multimodal
        # quickstart) pass None to mean "unset". Coerce None back to the
        # default so it does not fail type validation.
        if v is None:
            return MultimodalConfig()
        return v

    attention_dp_config: Optional[AttentionDpConfig] = Field(
        default=None,
        description="Optimized load-balancing for the DP Attention scheduler.",
        status="beta")

    disable_overlap_scheduler: bool = Field(
        default=False,
        description="Disable the overlap scheduler.",
        status="beta")

    enable_return_routed_experts: bool = Field(
        default=False,
        description=
        "Router Replay (R3): capture per-token pre-EPLB logical top-k MoE expert "
        "ids so they can be returned on outputs (per request via "
        "SamplingParams.return_routed_experts), for train/inference routing "
        "alignment in MoE reinforcement learning. Zero overhead when disabled. "
        "Separated-routing MoE backends only.",
        status="beta")

    moe_config: MoeConfig = Field(default_factory=MoeConfig,
                                  description="MoE config.",
                                  status="beta")

    nvfp4_gemm_config: Nvfp4GemmConfig = Field(
        default_factory=Nvfp4GemmConfig,
        description="NVFP4 GEMM backend config.",
        status="beta")

    dwdp_config: Optional[DwdpConfig] = Field(
        default=None,
        description="DWDP (Distributed Weight Data Parallelism) config.",
        status="prototype")

    encoder_max_batch_size: Optional[int] = Field(
        default=None,
        description=
        ("Maximum number of top-level encoder inputs processed in one "
         "iteration. For encoder-decoder models, each encoder request counts "
         "as one input. For multimodal models, each atomic image, video, or "
         "other encoder item counts as one input, even if it expands into "
         "multiple internal attention sequences. For encoder-decoder models, "
         "it also limits encoder CUDA graph batch sizes. Falls back to "
         "`max_batch_size` when unset."),
        status="prototype")

    encoder_max_num_tokens: Optional[int] = Field(
        default=None,
        description=(
            "Maximum number of encoder tokens. For encoder-decoder models, this "
            "limits encoder CUDA graph total-token buckets. For multimodal "
            "models, it limits encoder attention tokens scheduled in one "
            "iteration and is shared across all encoded modalities. It falls "
            "back to `max_num_tokens` when unset. Because an atomic multimodal "
            "item cannot be split, the effective budget is raised to the "
            "model's largest atomic item when necessary."),
        status="prototype")

    @model_validator(mode="before")
    @classmethod
    def _drop_removed_args(cls, data: Any) -> Any:
        """Drop removed arguments; their checks reject unserviceable values."""
        if not isinstance(data, dict):
            return data
        removed = TORCH_LLMARGS_REMOVED_ARGS.intersection(data)
        if not removed:
            return data
        data = dict(data)
        for key in sorted(removed):
            _TORCH_LLMARGS_REMOVED_ARG_CHECKS[key](data.pop(key))
        return data

    @field_validator("encoder_max_batch_size", "encoder_max_num_tokens")
    @classmethod
    def validate_encoder_runtime_sizes(cls, v: Optional[int]) -> Optional[int]:
        if v is not None and v <= 0:
            raise ValueError("must be a positive integer when set")
        return v

    @model_validator(mode="after")
    def validate_encoder_cuda_graph_config(self) -> 'TorchLlmArgs':
        if self.encoder_cuda_graph_config is None:
            return self
        if self.encode_only:
            raise ValueError(
                "Use cuda_graph_config=EncodeCudaGraphConfig(...) when "
                "encode_only=True; encoder_cuda_graph_config is for "
                "encoder-decoder models.")
        if self.encoder_max_batch_size is None:
            raise ValueError(
                "encoder_cuda_graph_config requires encoder_max_batch_size.")
        # `num_tokens` / `seq_lens` are checked by the model engine rather than
        # here: an encoder whose input is a fixed-shape per-request feature
        # tensor derives both from the model, and only the engine knows which
        # kind of encoder the model has. It still raises for the token encoders
        # that require them.
        return self

    attn_backend: str = Field(
        default='TRTLLM',
        description="Attention backend to use.",
        status="beta",
        # Recognized values mirror get_attention_backend dispatch in
        # tensorrt_llm/_torch/attention/backends/utils.py.
        telemetry=TelemetryField.categorical("VANILLA", "TRTLLM", "FLASHINFER"))

    enable_mla_skip_correction: bool = Field(
        default=False,
        description=
        ("Enable threshold-based skip-correction for trtllm-gen MLA attention "
         "kernels on SM100 and SM103. When enabled, "
         "mla_skip_correction_threshold controls the optimization threshold."),
        status="prototype")

    mla_skip_correction_threshold: float = Field(
        default=8.0,
        gt=0.0,
        le=32.0,
        description=
        ("Threshold for threshold-based skip-correction. This is used only "
         "when enable_mla_skip_correction is True. The default is 8. The maximum "
         "supported value depends on the selected kernel's BMM2 dtype: 8 for "
         "E4M3, 15 for FP16, and 32 for BF16."),
        status="prototype")

    @model_validator(mode="after")
    def validate_mla_skip_correction_config(self) -> 'TorchLlmArgs':
        if self.enable_mla_skip_correction and self.attn_backend.upper(
        ) != "TRTLLM":
            raise ValueError(
                "enable_mla_skip_correction requires attn_backend='TRTLLM'.")
        return self

    sampler_force_async_worker: bool = Field(
        default=False,
        description="Force usage of the async worker in the sampler for D2H "
        "copies, even if confidential compute is not active. Normally, the "
        "async worker should only be used when confidential compute is active. "
        "This argument is provided to enable it for testing purposes, "
        "irrespective of confidential compute state.",
        status="prototype")

    enable_in_graph_sampling: bool = Field(
        default=False,
        description="Opt-in in-graph sampling: capture part of the "
        "sampling work into the model's CUDA graph and run it there, instead "
        "of eagerly after the forward. The sampler itself is unchanged; only "
        "where its work runs differs. Batches whose sampling cannot be "
        "captured are unaffected and keep the eager path. This captures an "
        "additional set of CUDA graphs at startup, which makes warmup "
        "noticeably slower and costs extra memory, in exchange for lower "
        "per-step sampling overhead.",
        status="prototype")

    enable_speculative_beam_history_d2h: bool = Field(
        default=False,
        description="Opt-in beam-search optimization: skip per-step "
        "beam-history D2H copies on likely-non-terminal steps via a "
        "host-side predictor and route the remaining copies through a "
        "private side stream. Mispredictions fall back to a synchronous "
        ".cpu(), preserving correctness but breaking overlap on that step. "
        "Incompatible with the async D2H worker "
        "(sampler_force_async_worker=True or confidential compute).",
        status="prototype")

    enable_early_first_token_response: bool = Field(
        default=False,
        description=
        "Under the overlap scheduler, emit the first-token response ahead of "
        "the next sample step to reduce TTFT. No effect when the overlap "
        "scheduler is disabled.",
        status="prototype")

    enable_low_latency_host_dispatch: bool = Field(
        default=False,
        description="Use low-latency spin-wait mode for CUDA host task dispatch "
        "(cudaLaunchHostFunc_v2 with cudaHostTaskSpinWait). "
        "Reduces callback latency at the cost of a CPU core spinning while "
        "waiting for the GPU event. Requires CUDA 13.2+; on older CUDA "
        "versions, falls back to the default blocking mode and logs a "
        "one-time warning.",
        status="prototype")

    enable_iter_perf_stats: bool = Field(
        default=False,
        description="Enable iteration performance statistics.",
        status="prototype")

    enable_tokenization_cache: bool = Field(
        default=False,
        description=
        "Cache the tokenization of recent prompts so that a prompt extending a cached one only tokenizes its tail, which speeds up multi-turn serving with long prompts. Requires a fast tokenizer and applies only to prompts tokenized with add_special_tokens=False and no truncation. The output is identical to tokenizing the whole prompt.",
        status="prototype")

    enable_iter_req_stats: bool = Field(
        default=False,
        description=
        "If true, enables per request stats per iteration. Must also set enable_iter_perf_stats to true to get request stats.",
        status="prototype")

    print_iter_log: bool = Field(default=False,
                                 description="Print iteration logs.",
                                 status="beta")

    batch_wait_timeout_ms: NonNegativeFloat = Field(
        default=0,
        description=
        "If greater than 0, the request queue might wait up to batch_wait_timeout_ms to receive max_batch_size requests, if fewer than max_batch_size requests are currently available. If 0, no waiting occurs.",
        status="prototype")

    batch_wait_timeout_iters: NonNegativeInt = Field(
        default=0,
        description=
        "Maximum number of iterations the scheduler will wait to accumulate new coming requests for improved GPU utilization efficiency. If greater than 0, the scheduler will delay batch processing to gather more requests up to the specified iteration limit. If 0, disables timeout-iters-based batching delays.",
        status="prototype")

    batch_wait_max_tokens_ratio: float = Field(
        default=0,
        ge=0,
        le=1,
        description=
        "Token accumulation threshold ratio for batch scheduling optimization. If greater than 0, the scheduler will accumulate requests locally until the total token count reaches batch_wait_max_tokens_ratio * max_num_tokens. This mechanism enhances GPU utilization efficiency by ensuring adequate batch sizes. If 0, disables token-based batching delays.",
        status="prototype")

    torch_compile_config: Optional[TorchCompileConfig] = Field(
        default=None, description="Torch compile config.", status="prototype")

    prefill_cuda_graph_backend: PrefillCudaGraphBackend = Field(
        default=PrefillCudaGraphBackend.DISABLED,
        description="CUDA graph implementation used for prefill requests. "
        "Defaults to disabled.",
        status="prototype")

    prefill_capture_num_tokens: Optional[List[int]] = Field(
        default=None,
        description=
        "Token-count buckets captured by the selected prefill CUDA graph implementation.",
        status="prototype")

    enable_autotuner: bool = Field(
        default=True,
        description=
        "Enable autotuner for all tunable ops. This flag is for debugging purposes only, and the performance may significantly degrade if set to false.",
        status="prototype")

    use_fine_grained_sync: bool = Field(
        default=False,
        description=
        "Enable fine-grained synchronization for MoE kernels on SM107. The FC1 producer kernel signals "
        "per-tile completion flags in device memory and the FC2 consumer kernel waits on them, so the "
        "two GEMMs overlap instead of serializing at kernel launch boundaries.",
        status="prototype")

    enable_layerwise_nvtx_marker: bool = Field(
        default=False,
        description="If true, enable layerwise nvtx marker.",
        status="beta")

    load_format: Union[str, LoadFormat] = Field(
        default=LoadFormat.AUTO,
        description=
        "How to load the model weights. By default, detect the weight type from the model checkpoint.",
        telemetry=TelemetryField.categorical("auto", "dummy", "vision_only",
                                             "gms"))

    enable_min_latency: bool = Field(
        default=False,
        description=
        "If true, enable min-latency mode. Currently only used for Llama4.",
        status="beta")

    # TODO: make this a per-request parameter
    stream_interval: PositiveInt = Field(
        default=1,
        description=
        "The iteration interval to create responses under the streaming mode. "
        "Set this to a larger value when the batch size is large, which helps reduce the streaming overhead."
    )

    force_dynamic_quantization: bool = Field(
        default=False,
        description="If true, force dynamic quantization. Defaults to False.",
        status="prototype")

    allreduce_strategy: Optional[Literal[
        'AUTO', 'NCCL', 'UB', 'MINLATENCY', 'ONESHOT', 'TWOSHOT',
        'LOWPRECISION', 'MNNVL',
        'NCCL_SYMMETRIC']] = Field(default='AUTO',
                                   description="Allreduce strategy to use.",
                                   status="beta")

    checkpoint_loader: Optional[object] = Field(
        default=None,
        description=
        "The checkpoint loader to use for this LLM instance. You may use a custom checkpoint loader by subclassing "
        "`BaseCheckpointLoader` and providing an instance of the subclass here to load weights from a custom "
        "checkpoint format.\n"
        "If neither checkpoint_format nor checkpoint_loader are provided, checkpoint_format will be set to HF "
        "and the default HfCheckpointLoader will be used.\n"
        "If checkpoint_format and checkpoint_loader are both provided, checkpoint_loader will be ignored.",
        json_schema_extra={
            "type":
            "Optional[tensorrt_llm._torch.models.checkpoints.BaseCheckpointLoader]"
        },
        status="prototype",
    )

    checkpoint_format: Optional[str] = Field(
        default=None,
        description=
        "The registered checkpoint loader format to use. `MX` selects ModelExpress as an opportunistic P2P "
        "loading path and falls back to loading the provided Hugging Face checkpoint; it does not require "
        "converting that checkpoint to an MX-specific format. You may use a custom checkpoint format by subclassing "
        "`BaseCheckpointLoader` and registering it with `register_checkpoint_loader`.\n"
        "If neither checkpoint_format nor checkpoint_loader are provided, checkpoint_format will be set to HF "
        "and the default HfCheckpointLoader will be used.\n"
        "If checkpoint_format and checkpoint_loader are both provided, checkpoint_loader will be ignored.",
        status="prototype",
    )

    checkpoint_io_policy: Literal[
        "auto", "native", "rank_striped_read_ahead"] = Field(
            default="auto",
            description=
            "Controls checkpoint storage I/O independently of checkpoint format. "
            "'auto' selects rank-striped read-ahead for compatible built-in "
            "PyTorch/HF loads and selects native I/O otherwise. "
            "'native' preserves the existing loader. "
            "'rank_striped_read_ahead' lets node-local ranks read disjoint "
            "SafeTensors extents while native mapping, materialization, and H2D "
            "continue. Incompatible configurations select native I/O before "
            "optimized reader or collective setup. Runtime-ineligible loads fall "
            "back to native before model mutation.",
            status="prototype",
            json_schema_extra={
                "type": "Literal['auto', 'native', 'rank_striped_read_ahead']"
            },
        )

    @property
    def is_partial_model_loading(self) -> bool:
        """Whether model overrides request loading only part of the model."""
        return (self.model_kwargs is not None
                and "num_hidden_layers" in self.model_kwargs)

    mx_config: ModelExpressConfig = Field(
        default_factory=ModelExpressConfig,
        description="ModelExpress (MX) P2P checkpoint loading config.",
        status="prototype",
    )

    gms_config: GmsConfig = Field(
        default_factory=GmsConfig,
        description="GPU Memory Service (GMS) weight sharing config.",
        status="prototype",
    )

    kv_connector_config: Optional[KvCacheConnectorConfig] = Field(
        default=None,
        description="The config for KV cache connector.",
        status="prototype",
    )

    mm_encoder_only: bool = Field(
        default=False,
        description=
        "Only load/execute the vision encoder part of the full model. Defaults to False.",
        status="prototype")

    disable_mm_encoder: bool = Field(
        default=False,
        description=
        "Skip instantiating and loading the multimodal (e.g. vision) encoder "
        "of a multimodal checkpoint and serve it text-only. Saves the "
        "encoder's GPU memory (enlarging the KV cache pool) for workloads "
        "that never send image/video/audio inputs; such requests are "
        "rejected. Only takes effect for model implementations that support "
        "it (currently Mistral3 and the Qwen3-VL / Qwen3.5-VL family); a "
        "no-op otherwise. "
        "Defaults to False.",
        status="prototype")

    encode_only: bool = Field(
        default=False,
        description=
        "Set to True to use the batch-forward encode() path, which runs a "
        "single forward pass and returns the model output directly, bypassing "
        "the scheduler and autoregressive loop. Works for encoder-only "
        "models (BERT, RoBERTa, reward models) and decoder models used in "
        "single-prefill mode (e.g., extracting embeddings). When False "
        "(default), uses the standard generate() path.",
        status="prototype")

    ray_worker_extension_cls: Optional[str] = Field(
        default=None,
        description="The full worker extension class name including module path. "
        "Allows users to extend the functions of the RayGPUWorker class.",
        status="prototype")

    ray_placement_config: Optional[RayPlacementConfig] = Field(
        default=None,
        description=
        "Placement config for RayGPUWorker. Only used with AsyncLLM and orchestrator_type='ray'.",
        exclude=True,
        status="prototype")

    ray_worker_nsight_options: Optional[dict[str, str]] = Field(
        default=None,
        description="Nsight options.",
        status="prototype",
    )

    sleep_config: Optional[SleepConfig] = Field(
        default=None,
        description="Configuration for the LLM sleep feature. "
        "Sleep feature requires extra setup that may slow down model loading. "
        "Only enable it if you intend to use this feature.",
        status="prototype")

    reorder_policy_config: Optional[ReorderRequestPolicyConfig] = Field(
        default=None,
        description="The request reordering policy to use.",
        status="prototype",
    )

    enable_resource_governor: bool = Field(
        default=False,
        description="Enable the resource governor for runtime cache management "
        "operations such as KV cache truncation. This adds a per-iteration "
        "broadcast collective.",
        status="prototype")

    # fp8 cute dsl configs
    use_cute_dsl_blockscaling_mm: bool = Field(
        default=False,
        description="If true, use CuTe DSL fp8 blockscaling mm implementation.",
        status="prototype")
    use_cute_dsl_blockscaling_bmm: bool = Field(
        default=False,
        description="If true, use CuTe DSL fp8 blockscaling bmm implementation.",
        status="prototype")
    # bf16 cute dsl configs
    use_cute_dsl_bf16_bmm: bool = Field(
        default=False,
        description=
        "If true, use CuTe DSL BF16 BMM on Blackwell (SM100/SM103) and Rubin (SM107), "
        "including the DeepSeek-V4 o_a projection on Rubin when DSL support and "
        "dimension alignment permit. Defaults to false; automatically enabled "
        "with pipeline_parallel_size > 1 on SM100/SM103/SM107.",
        status="prototype")
    use_cute_dsl_bf16_gemm: bool = Field(
        default=False,
        description=
        "If true, use CuTe DSL BF16 persistent GEMM for Linear layers on Blackwell "
        "(SM100/SM103) and Rubin (SM107) when supported. Defaults to false; "
        "automatically enabled with pipeline_parallel_size > 1 on SM100/SM103/SM107.",
        status="prototype")

    # PrivateVars
    _quant_config: Optional[QuantConfig] = PrivateAttr(default=None)

    max_stats_len: int = Field(
        default=1000,
        ge=-1,
        description=
        "The max number of performance statistic entries. Set to -1 to keep all entries. "
        "Set to 0 to use a minimum buffer size of 1.",
        status="prototype",
    )

    @field_validator('max_stats_len')
    @classmethod
    def normalize_max_stats_len(cls, v):
        if v == -1:
            return v
        return max(v, 1)

    layer_wise_benchmarks_config: LayerwiseBenchmarksConfig = Field(
        default_factory=LayerwiseBenchmarksConfig,
        description="Configuration for layer-wise benchmarks calibration.",
        status="prototype")

    @property
    def quant_config(self) -> QuantConfig:
        if self._quant_config is None:
            self._quant_config = QuantConfig()
        return self._quant_config

    @quant_config.setter
    def quant_config(self, value: QuantConfig):
        self._quant_config = value

    # TODO: remove backend later
    backend: Literal["pytorch"] = Field(
        default="pytorch",
        description="The backend to use for this LLM instance.",
        exclude_json_schema=True,
        status="deprecated")
# [kvoffload excerpt] TorchLlmArgs goes on with validators, methods and private attributes only (from convert_load_format), left out.


# [kvoffload excerpt] left out: update_llm_args_with_extra_dict (the merge of the YAML mapping into the CLI-derived one).
def update_llm_args_with_extra_options(
        llm_args: Dict,
        extra_llm_api_options: str,
        explicit_cli_keys: Optional[Set[str]] = None) -> Dict:
    if extra_llm_api_options is not None:
        with open(extra_llm_api_options, 'r') as f:
            llm_args_dict = yaml.safe_load(f)
        if llm_args_dict is None:
            llm_args_dict = {}
        elif not isinstance(llm_args_dict, dict):
            raise ValueError("Configuration file root must be a mapping.")
        llm_args = update_llm_args_with_extra_dict(
            llm_args,
            llm_args_dict,
            extra_llm_api_options,
            explicit_cli_keys=explicit_cli_keys)
    return llm_args


LlmArgs = TorchLlmArgs
