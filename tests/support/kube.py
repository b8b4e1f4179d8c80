"""pytest fixtures: the emulated Kubernetes API, and kopf running for real against it.

``kube`` serves a :class:`kvoffload.kubeemu.KubeEmulator` (with the KVOffloadPolicy
resource registered) on a free 127.0.0.1 port in the test's event loop, writes a
kubeconfig for it, and gives an official ``kubernetes.client.ApiClient`` and a
``KubernetesGateway`` bound to it. The kubernetes client is blocking: call it from
async tests through ``asyncio.to_thread`` (the gateway does), or the loop that serves
the emulator stalls.

kopf runs either in-process, in a thread with its own loop (:func:`running_kopf`:
``kopf.operator`` with a login handler that points it at the emulator), or as
``kopf run`` in a subprocess that finds the emulator through ``$KUBECONFIG``
(:func:`kopf_subprocess`). Either way it talks to the emulator over HTTP only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import os
import sys
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import kopf
import kubernetes.client
import pytest
import pytest_asyncio

from kvoffload.api.conventions import API_GROUP, API_VERSION, KIND, PLURAL
from kvoffload.controller.gateway import KubernetesGateway, RetryPolicy
from kvoffload_lab.cluster.kubeemu import KubeEmulator, serve, write_kubeconfig
from kvoffload_lab.processes import KILL_WAIT_S

T = TypeVar("T")

POLICY_RESOURCE = f"{API_GROUP}/{API_VERSION}/{PLURAL}"
POLICY_API_VERSION = f"{API_GROUP}/{API_VERSION}"


def policy_emulator() -> KubeEmulator:
    """An emulator that also serves KVOffloadPolicy, as the installed CRD would."""
    emulator = KubeEmulator()
    emulator.register(POLICY_RESOURCE, kind=KIND, namespaced=True, subresources={"status"}, shortnames={"kvop"})
    return emulator


@dataclasses.dataclass
class EmulatedCluster:
    """A served emulator and the ways to reach it."""

    emulator: KubeEmulator
    url: str
    kubeconfig: Path
    api_client: kubernetes.client.ApiClient

    def gateway(self, retry: RetryPolicy | None = None) -> KubernetesGateway:
        """A gateway on this cluster; fast retries unless told otherwise."""
        return KubernetesGateway(self.api_client, retry=retry or RetryPolicy(attempts=5, base_delay=0.01))

    def connection(self) -> kopf.ConnectionInfo:
        """kopf's credentials for the emulator (plain HTTP, no auth)."""
        return kopf.ConnectionInfo(server=self.url, default_namespace="default")

    async def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run a blocking kubernetes-client call without stalling the emulator's loop."""
        return await asyncio.to_thread(fn, *args, **kwargs)


async def wait_for(check: Callable[[], T | Awaitable[T | None] | None], what: str, timeout: float = 5.0) -> T:
    """Poll ``check`` (sync or async) until it returns something truthy; fail naming ``what`` at the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result  # type: ignore[return-value]
        if loop.time() >= deadline:
            pytest.fail(f"timed out after {timeout:.1f}s waiting for {what} (last: {result!r})")
        await asyncio.sleep(0.02)  # a poll interval; the loop keeps serving the emulator meanwhile


@pytest_asyncio.fixture
async def kube(tmp_path: Path) -> AsyncIterator[EmulatedCluster]:
    """The emulated Kubernetes API on a free loopback port, with a kubeconfig and an ApiClient."""
    async with serve(policy_emulator()) as (emulator, url):
        api_client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=url))
        try:
            yield EmulatedCluster(emulator, url, write_kubeconfig(url, tmp_path / "kubeconfig"), api_client)
        finally:
            api_client.close()  # type: ignore[no-untyped-call]


def fast_kopf_settings() -> kopf.OperatorSettings:
    """kopf settings for tests: the operator's own finalizer/annotation prefix, short timeouts."""
    settings = kopf.OperatorSettings()
    settings.persistence.finalizer = f"{API_GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=API_GROUP)
    settings.networking.request_timeout = 5.0
    settings.queueing.idle_timeout = 1.0
    settings.queueing.exit_timeout = 2.0
    return settings


# The emulator that kopf logs in to; kopf's tasks inherit it from the context it runs in,
# so one login handler per registry serves every test.
_EMULATOR: contextvars.ContextVar[kopf.ConnectionInfo] = contextvars.ContextVar("kvoffload_emulator")
_REGISTRIES_WITH_LOGIN: weakref.WeakSet[kopf.OperatorRegistry] = weakref.WeakSet()


def _login_to_emulator(**_: Any) -> kopf.ConnectionInfo | None:
    return _EMULATOR.get(None)


def _with_emulator_login(registry: kopf.OperatorRegistry) -> kopf.OperatorRegistry:
    """Add the login handler once; it overrides kopf's fallback logins (kubeconfig, in-cluster)."""
    if registry not in _REGISTRIES_WITH_LOGIN:
        kopf.on.login(registry=registry, id="kvoffload-emulator-login")(_login_to_emulator)
        _REGISTRIES_WITH_LOGIN.add(registry)
    return registry


@contextlib.asynccontextmanager
async def running_kopf(
    cluster: EmulatedCluster,
    *,
    registry: kopf.OperatorRegistry | None = None,
    settings: kopf.OperatorSettings | None = None,
    memo: object | None = None,
    startup_timeout: float = 10.0,
) -> AsyncIterator[threading.Thread]:
    """Run ``kopf.operator`` in its own thread and event loop against the emulator (all namespaces, standalone).

    Its own loop, because kopf, on exit, waits for and then cancels every task created in its
    loop after it started, which in a shared loop includes the emulator's connections. The
    registry defaults to kopf's global one, where ``@kopf.on...`` decorators put handlers.
    kopf is stopped on exit, and whatever it failed with is raised.
    """
    stop, ready = threading.Event(), threading.Event()
    registry = _with_emulator_login(registry if registry is not None else kopf.get_default_registry())
    login = _EMULATOR.set(cluster.connection())
    context = contextvars.copy_context()  # the kopf thread's tasks see this emulator
    _EMULATOR.reset(login)
    outcome: concurrent.futures.Future[None] = concurrent.futures.Future()
    operator = kopf.operator(
        registry=registry,
        settings=settings or fast_kopf_settings(),
        memo=memo,
        standalone=True,
        clusterwide=True,
        stop_flag=stop,
        ready_flag=ready,
    )

    def run() -> None:
        try:
            context.run(asyncio.run, operator)
        except BaseException as exc:
            outcome.set_exception(exc)
        else:
            outcome.set_result(None)

    thread = threading.Thread(target=run, name="kopf operator (test)", daemon=True)
    thread.start()
    try:
        await wait_for(lambda: ready.is_set() or outcome.done(), "kopf to start", timeout=startup_timeout)
        if outcome.done():
            outcome.result()  # raises what kopf failed with
            pytest.fail("kopf exited while starting")
        yield thread
    finally:
        stop.set()
        async with asyncio.timeout(15):
            await asyncio.wrap_future(outcome)
        await asyncio.to_thread(thread.join, 5)


@contextlib.asynccontextmanager
async def _process_on(
    cluster: EmulatedCluster, *argv: str, env: dict[str, str] | None = None, grace: float = 15.0
) -> AsyncIterator[asyncio.subprocess.Process]:
    """A Python subprocess that finds the emulator through $KUBECONFIG; terminated (then killed) on exit.

    Its output goes to the test's captured stderr."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, *argv, env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig), **(env or {})}
    )
    try:
        yield process
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                async with asyncio.timeout(grace):
                    await process.wait()
            except TimeoutError:
                process.kill()
                async with asyncio.timeout(KILL_WAIT_S):
                    await process.wait()


def kvoffload_run(
    cluster: EmulatedCluster, *args: str
) -> contextlib.AbstractAsyncContextManager[asyncio.subprocess.Process]:
    """``kvoffload run ARGS`` as the image runs it."""
    return _process_on(cluster, "-c", "from kvoffload.cli.main import main; main()", "run", *args)


_RECORD_MODULES = """
import atexit, json, os, sys
atexit.register(lambda: open(os.environ["KVOFFLOAD_MODULES_OUT"], "w").write(json.dumps(sorted(sys.modules))))
from kvoffload.cli.main import main
main()
"""


def kvoffload_run_recording_modules(
    cluster: EmulatedCluster, out: Path, *args: str
) -> contextlib.AbstractAsyncContextManager[asyncio.subprocess.Process]:
    """``kvoffload run ARGS``, writing the names in ``sys.modules`` into ``out`` (JSON) when it exits."""
    return _process_on(cluster, "-c", _RECORD_MODULES, "run", *args, env={"KVOFFLOAD_MODULES_OUT": str(out)})


def kopf_subprocess(
    cluster: EmulatedCluster, *args: str, env: dict[str, str] | None = None
) -> contextlib.AbstractAsyncContextManager[asyncio.subprocess.Process]:
    """``kopf run --standalone --all-namespaces ARGS``."""
    return _process_on(cluster, "-m", "kopf", "run", "--standalone", "--all-namespaces", *args, env=env, grace=10.0)


def policy_manifest(name: str, namespace: str = "default", spec: dict[str, Any] | None = None) -> dict[str, Any]:
    """A KVOffloadPolicy object with any spec (the emulator does not validate custom resources)."""
    return {
        "apiVersion": POLICY_API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec if spec is not None else {},
    }


__all__ = (
    "EmulatedCluster",
    "fast_kopf_settings",
    "kopf_subprocess",
    "kube",
    "kvoffload_run_recording_modules",
    "policy_emulator",
    "policy_manifest",
    "running_kopf",
    "wait_for",
)
