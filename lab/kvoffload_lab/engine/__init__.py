"""The engine emulator behind ``kvoffload emulate``: vLLM's /metrics and cache behaviour, priced by a cost model.

It keeps a block-level GPU prefix cache and the offload tiers (CPU, filesystem) the flags
describe, prices each request's time to first token, really waits that long, then emits
output tokens at the inter-token latency. Its ``/metrics`` carries exactly the ``vllm:``
families of a real vLLM 0.32 capture, plus the ``vllm:kv_offload_*`` families a GPU build
shows with offloading on, which vLLM for CPU cannot.

With ``--speak sglang`` the same engine exposes SGLang 0.5.23's ``sglang:`` families instead
(``sglangmetrics``): the caches and prices stay the ones above, so SGLang's HiCache is priced as
vLLM's native offload, and only /metrics (and the HTTP counts) differ.

``flags`` and ``config`` read the command line, ``faults`` the injected faults,
``kvengine`` the caches (``blockcache``) and prices (``costmodel``), ``registry`` the /metrics
registry the server fills (vLLM's: ``families`` and ``metrics``; SGLang's: ``sglangmetrics``), and
``server`` serves it all over HTTP.
"""
