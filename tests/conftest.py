"""Shared pytest setup: fixtures live in tests/support, one module per real part."""

pytest_plugins = [
    "tests.support.summary",  # first: the fixture modules below import it
    "tests.support.deadlines",
    "tests.support.ordering",
    "tests.support.prometheus",
    "tests.support.vllm",
    "tests.support.kube",
    "tests.support.controlplane",
    "tests.support.engines",
    "tests.support.cluster",
    "tests.support.traces",
    "tests.support.realkube",
]
