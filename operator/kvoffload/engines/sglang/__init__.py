"""SGLang: ``sglang.launch_server`` with its hierarchical cache (HiCache) and its file storage backend."""
