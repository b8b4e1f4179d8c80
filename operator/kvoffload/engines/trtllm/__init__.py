"""TensorRT-LLM (``trtllm-serve``): its option and field tables, read from its own sources, and the check of an
``--extra_llm_api_options`` document against them. Not an engine of the seam yet (no ``Engine`` is registered)."""
