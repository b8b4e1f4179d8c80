"""The published figures of GPU classes (host link, HBM bandwidth, dense bf16 rate, memory), each from a
vendor document: what estimated profiles are scaled by, and the memory bandwidth of a profile without its own.

Pure: standard library only, as ``profile`` is, so the calibration can import it on a GPU image."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    """Published figures of one GPU class, each from a vendor document listed in ``citations``."""

    gpu_class: str
    product: str
    host_link: str
    """E.g. ``PCIe Gen5 x16``."""
    host_link_bytes_per_second: float
    """Theoretical per-direction rate of the host link."""
    hbm_bytes_per_second: float
    bf16_dense_flops: float
    """Dense (no sparsity) bf16 tensor rate, FLOP/s."""
    memory_bytes: int
    citations: tuple[str, ...]


_GB = 10**9
_GIB = 1024**3
_MIB = 1024**2

# Vendor figures. Host link rates are per direction, theoretical: PCIe Gen4 x16 32 GB/s,
# Gen5 x16 64 GB/s (the datasheets quote both directions together, 64 and 128 GB/s).
# bf16 rates are dense; the datasheets' larger figures count 2:4 sparsity.
PUBLISHED_SPECS: Mapping[str, GpuSpec] = {
    s.gpu_class: s
    for s in (
        GpuSpec(
            "nvidia-h200-141gb",
            "NVIDIA H200 SXM",
            "PCIe Gen5 x16",
            64e9,
            4.8e12,
            989e12,
            143771 * _MIB,
            (
                "https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM: 141 GB HBM3e, 4.8 TB/s, "
                "BF16 Tensor Core 1,979 TFLOPS with sparsity, PCIe Gen5 128 GB/s)",
            ),
        ),
        GpuSpec(
            "nvidia-h100-80gb",
            "NVIDIA H100 SXM",
            "PCIe Gen5 x16",
            64e9,
            3.35e12,
            989e12,
            80 * _GIB,
            (
                "https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM: 80 GB HBM3, 3.35 TB/s, "
                "BF16 Tensor Core 1,979 TFLOPS with sparsity, PCIe Gen5 128 GB/s)",
            ),
        ),
        GpuSpec(
            "nvidia-b200",
            "NVIDIA B200 (HGX B200)",
            "PCIe Gen5 x16",
            64e9,
            8.0e12,
            2.25e15,
            180 * _GB,
            (
                "https://www.nvidia.com/en-us/data-center/hgx/ (HGX B200, per GPU: 180 GB HBM3e, 8 TB/s, "
                "FP16/BF16 4.5 PFLOPS with sparsity, i.e. 2.25 dense)",
                "https://glennklockwood.com/garden/processors/B200 (HGX B200 at 1,000 W: BF16 2,250 TFLOPS dense; "
                "the chip speaks PCIe Gen6, but HGX B200's x86 hosts link it at Gen5 x16, which is assumed here)",
            ),
        ),
        GpuSpec(
            "nvidia-a100-80gb",
            "NVIDIA A100 80GB SXM",
            "PCIe Gen4 x16",
            32e9,
            2.039e12,
            312e12,
            80 * _GIB,
            (
                "https://www.nvidia.com/en-us/data-center/a100/ (A100 80GB SXM: HBM2e 2,039 GB/s, "
                "BF16 Tensor Core 312 TFLOPS, 624 with sparsity, PCIe Gen4 64 GB/s)",
            ),
        ),
        GpuSpec(
            "nvidia-a100-40gb",
            "NVIDIA A100 40GB SXM",
            "PCIe Gen4 x16",
            32e9,
            1.555e12,
            312e12,
            40 * _GIB,
            (
                "https://www.nvidia.com/en-us/data-center/a100/ (A100 40GB SXM: HBM2 1,555 GB/s, "
                "BF16 Tensor Core 312 TFLOPS, 624 with sparsity, PCIe Gen4 64 GB/s)",
            ),
        ),
        GpuSpec(
            "nvidia-l40s",
            "NVIDIA L40S",
            "PCIe Gen4 x16",
            32e9,
            864e9,
            362.05e12,
            48 * _GB,
            (
                "https://www.nvidia.com/en-us/data-center/l40s/ (L40S: 48 GB GDDR6, 864 GB/s, "
                "BF16 Tensor Core 362.05 TFLOPS, 733 with sparsity, PCIe Gen4 x16 64 GB/s bidirectional)",
            ),
        ),
        GpuSpec(
            "nvidia-l4",
            "NVIDIA L4",
            "PCIe Gen4 x16",
            32e9,
            300e9,
            121e12,
            24 * _GB,
            (
                "https://www.nvidia.com/en-us/data-center/l4/ (L4: 24 GB GDDR6, 300 GB/s, "
                "BF16 Tensor Core 242 TFLOPS with sparsity, i.e. 121 dense, PCIe Gen4 x16 64 GB/s)",
            ),
        ),
        GpuSpec(
            "amd-mi300x",
            "AMD Instinct MI300X",
            "PCIe Gen5 x16",
            64e9,
            5.3e12,
            1307.4e12,
            192 * _GIB,
            (
                "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html (MI300X: 192 GB HBM3, "
                "5.3 TB/s, peak BF16 1,307.4 TFLOPS dense, 2,614.9 with sparsity, PCIe Gen5 x16 128 GB/s)",
            ),
        ),
    )
}
