"""Ready pods for every operator-made Deployment, for a bench plane with no kubelet and no controller manager.

The operator counts a level's Ready replicas from its pods, so a fleet can only climb to Stable with pods. The
stand-in plays the ReplicaSet controller, the garbage collector and the kubelet at once, and only as far as the
operator looks: every 2 s it makes each Deployment's missing pods from its template (owned by the Deployment,
status Running and Ready), deletes the surplus, and deletes the pods of Deployments that are gone. No engine runs.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import threading
from typing import Any

import kubernetes.client

from kvoffload.api.conventions import LABEL_POLICY

READY = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}


class PodStandIn:
    def __init__(self, api: kubernetes.client.ApiClient, namespaces: list[str], period_s: float = 2.0) -> None:
        self.apps = kubernetes.client.AppsV1Api(api)
        self.core = kubernetes.client.CoreV1Api(api)
        self.period_s = period_s
        self.made = 0
        self.deleted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod stand-in", daemon=True)
        for namespace in namespaces:  # ServiceAccount admission wants it; its controller does not run
            self.core.create_namespaced_service_account(namespace, {"metadata": {"name": "default"}})

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            while not self._stop.wait(self.period_s):
                try:
                    list(pool.map(lambda job: job(), self._jobs()))
                except kubernetes.client.ApiException as exc:
                    print(f"      pod stand-in: {exc.status} {exc.reason}; next round", flush=True)

    def _list(self, call: Any) -> list[dict[str, Any]]:
        answer = call(label_selector=LABEL_POLICY, _preload_content=False)
        return list(json.loads(answer.data)["items"])

    def _jobs(self) -> list[Any]:
        deployments = self._list(self.apps.list_deployment_for_all_namespaces)
        pods = self._list(self.core.list_pod_for_all_namespaces)
        owned: dict[str, list[dict[str, Any]]] = {}
        for pod in pods:
            owner = next(iter(pod["metadata"].get("ownerReferences") or []), {}).get("uid", "")
            owned.setdefault(owner, []).append(pod)
        jobs: list[Any] = []
        uids = set()
        for deployment in deployments:
            meta = deployment["metadata"]
            uids.add(meta["uid"])
            have = sorted(owned.get(meta["uid"], []), key=lambda pod: pod["metadata"]["name"])
            want = int(deployment["spec"].get("replicas", 1))
            names = {pod["metadata"]["name"] for pod in have}
            free = (f"{meta['name']}-{i}" for i in itertools.count() if f"{meta['name']}-{i}" not in names)
            jobs += [
                lambda d=deployment, n=name: self._make(d, n)
                for name in itertools.islice(free, max(0, want - len(have)))
            ]
            jobs += [lambda pod=pod: self._delete(pod) for pod in have[want:]]
        for owner, orphans in owned.items():
            if owner not in uids:
                jobs += [lambda pod=pod: self._delete(pod) for pod in orphans]
        return jobs

    def _make(self, deployment: dict[str, Any], name: str) -> None:
        meta, template = deployment["metadata"], deployment["spec"]["template"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": meta["namespace"],
                "labels": template["metadata"].get("labels", {}),
                "annotations": template["metadata"].get("annotations", {}),
                "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "Deployment", "name": meta["name"], "uid": meta["uid"],
                     "controller": True}
                ],
            },
            "spec": template["spec"],
        }  # fmt: skip
        self.core.create_namespaced_pod(meta["namespace"], pod)
        self.core.patch_namespaced_pod_status(name, meta["namespace"], {"status": READY})
        self.made += 1

    def _delete(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        try:
            self.core.delete_namespaced_pod(meta["name"], meta["namespace"], grace_period_seconds=0)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise
        self.deleted += 1
