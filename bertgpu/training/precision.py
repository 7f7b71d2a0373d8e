"""Precision: what --precision auto means on this device, autocast, TF32, and the peak FLOP/s that MFU
is measured against at that precision."""

from __future__ import annotations

import contextlib
import functools
import re

import torch

from bertgpu.errors import UserError


def resolve_precision(precision: str, device: torch.device, cpu_bf16: bool = False) -> str:
    """``auto``: bf16 on GPUs that support it, and with ``cpu_bf16`` (--recipe fast: ``recipe.cpu_bf16``) on CPUs
    that multiply bf16 in hardware; else fp32."""
    if precision == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return "bf16"
        if device.type == "cpu" and cpu_bf16 and cpu_has_native_bf16():
            return "bf16"
        return "fp32"
    if precision == "fp16" and device.type != "cuda":
        raise UserError("--precision fp16 needs a CUDA GPU (use bf16 or fp32 on CPU)")
    return precision


@functools.cache  # the CPU's flags do not change; the layout check and the run both ask
def cpu_has_native_bf16() -> bool:
    """Whether this CPU has bf16 dot-product instructions (AVX512-BF16 or AMX): where it has not, oneDNN
    emulates bf16 and autocast would only slow a step down."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def allow_tf32(device: torch.device) -> None:
    """On a GPU, fp32 matmuls and convolutions run on TF32 tensor cores (10-bit mantissa inputs, fp32
    accumulation): what the bf16/fp16 autocast leaves in fp32 runs several times faster."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def autocast(precision: str, device: torch.device):
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


# Dense (not sparse) peak FLOP/s of one GPU, from NVIDIA's data sheets: (bf16/fp16 tensor cores, TF32 tensor
# cores; V100: fp16 and plain fp32, it has no TF32), keyed by a pattern of the exact model that
# torch.cuda.get_device_name prints. The first match wins, so a variant comes before its family. A card not
# listed (or a variant not told apart, e.g. an A10G, a plain "H100") has no peak: MFU is not shown rather
# than taken from a sibling card (--peak-tflops gives it).
_PEAK_FLOPS: tuple[tuple[str, str, float, float], ...] = (
    # (pattern, the card as its data sheet names it, bf16, tf32)
    (r"\bH100\b.*\bNVL\b", "H100 NVL", 835e12, 417.5e12),
    (r"\bH100\b.*\bPCIe\b", "H100 PCIe", 756e12, 378e12),
    (r"\bH100\b.*(\bSXM|80GB HBM3$)", "H100 SXM", 989.4e12, 494.7e12),
    (r"\bGH200\b", "GH200", 989.4e12, 494.7e12),
    (r"\bH200\b.*\bNVL\b", "H200 NVL", 835e12, 417.5e12),
    (r"\bH200$|\bH200\b.*\bSXM", "H200 SXM", 989.4e12, 494.7e12),
    (r"\bA100\b.*\b(SXM|PCIE|PCIe)", "A100 (SXM or PCIe, 40 or 80 GB)", 312e12, 156e12),
    (r"\bL40S$", "L40S", 362.05e12, 183e12),
    (r"\bL40$", "L40", 181e12, 90.5e12),
    (r"\bL4$", "L4", 121e12, 60e12),
    (r"\bA10$", "A10", 125e12, 62.5e12),
    (r"\bRTX 4090$", "GeForce RTX 4090", 165.2e12, 82.6e12),
    (r"\bRTX 3090$", "GeForce RTX 3090", 71e12, 35.6e12),
    (r"\bV100-SXM2", "V100 SXM2", 125e12, 15.7e12),
    (r"\bV100-PCIE", "V100 PCIe", 112e12, 14e12),
)


def card_peak(name: str, precision: str) -> tuple[float | None, str]:
    """The dense peak FLOP/s of the GPU ``name`` (as torch.cuda.get_device_name prints it) at ``precision``
    (bf16/fp16 on the tensor cores, fp32 as TF32), and a line saying which data-sheet figure it is; None
    and a line saying why for a card not in the table."""
    for pattern, card, half, tf32 in _PEAK_FLOPS:
        if re.search(pattern, name.strip()):
            peak = half if precision in ("bf16", "fp16") else tf32
            kind = "bf16/fp16" if precision in ("bf16", "fp16") else ("fp32" if "V100" in card else "TF32")
            return peak, f"peak {peak / 1e12:,.1f} TFLOP/s ({card}, dense {kind}, NVIDIA's data sheet)"
    return None, f"peak unknown for {name!r}: MFU not shown (give it with --peak-tflops)"


def peak_flops(device: torch.device, precision: str, given_tflops: float = 0.0) -> tuple[float | None, str]:
    """Peak FLOP/s of one GPU for MFU and where the figure comes from: ``given_tflops`` (--peak-tflops) when
    set, else the card's data sheet (``card_peak``); None on a CPU or an unlisted GPU."""
    if given_tflops > 0:
        return given_tflops * 1e12, f"peak {given_tflops:,.1f} TFLOP/s (--peak-tflops)"
    if device.type != "cuda":
        return None, "no MFU on a CPU"
    return card_peak(torch.cuda.get_device_name(device), precision)
