"""Does pinning vLLM's CPU tier need a capability or a memlock limit? Run on a GPU machine, as root:

    python bench/security/pin_without_capabilities.py            # as the rendered pod would: see below
    setpriv --bounding-set=-all --inh-caps=-all --no-new-privs \\
        sh -c 'ulimit -l 64; python bench/security/pin_without_capabilities.py'

vLLM's native offload maps one file in /dev/shm and registers it with cudaHostRegister. The rendered engine pod
drops every capability and cannot raise its privileges; this does the same registration and a copy to the GPU,
and prints the process's capabilities and memlock limit beside the outcome, as JSON.
"""

from __future__ import annotations

import json
import mmap
import os
import resource
import sys
import time

import torch

SIZE = 1 << 30


def capabilities() -> dict[str, str]:
    with open("/proc/self/status") as status:
        return {k: v.strip() for k, v in (line.split(":", 1) for line in status) if k.startswith("Cap")}


def main() -> int:
    path = f"/dev/shm/kvoffload_pin_check_{os.getpid()}.mmap"
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, SIZE)
        mapped = mmap.mmap(fd, SIZE)
        host = torch.frombuffer(mapped, dtype=torch.uint8)
        host.fill_(7)
        code = torch.cuda.cudart().cudaHostRegister(host.data_ptr(), SIZE, 0)
        device = torch.empty(SIZE, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        start = time.perf_counter()
        device.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        ok = int(code) == 0 and int(device[::4096].sum().item()) == 7 * (SIZE // 4096)
        result = {
            "cudaHostRegister": int(code),
            "copied_correctly": ok,
            "host_to_device_GBps": round(SIZE / seconds / 1e9, 1),
            "memlock_limit": resource.getrlimit(resource.RLIMIT_MEMLOCK),
            "euid": os.geteuid(),
            **capabilities(),
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
        }
        if int(code) == 0:
            torch.cuda.cudart().cudaHostUnregister(host.data_ptr())
    finally:
        os.close(fd)
        os.unlink(path)
    print(json.dumps(result))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
