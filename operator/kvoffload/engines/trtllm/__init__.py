"""TensorRT-LLM (``trtllm-serve``): its ``Engine`` (``command.py``), option and field tables read from its own
sources (``data/``, ``options.py``), the check of an ``--extra_llm_api_options`` document against them
(``extra_options.py``) and its metric dialect (``dialect.py``). Registered in ``engines/__init__.py`` by the
integrator, not here."""
