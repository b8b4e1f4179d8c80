# `helm test`: the operator answers through its Service: /healthz (its event loop beats) and /metrics
# (its own series). Standard library only: it runs in the operator's image, which has no curl.
import os
import sys
import urllib.request

url = os.environ["KVOFFLOAD_URL"]
for path, expected in (("/healthz", "alive"), ("/metrics", "kvoffload_verdicts_total")):
    try:
        with urllib.request.urlopen(url + path, timeout=10) as answer:
            body = answer.read().decode()
    except OSError as exc:  # refused, timed out, or an HTTP error status (503: the loop is wedged)
        sys.exit(f"{url}{path}: {exc}")
    if expected not in body:
        sys.exit(f"{url}{path}: no {expected!r} in the answer")
    print(f"{url}{path}: {body.splitlines()[0]}")
