"""ONNX Runtime execution providers: what ``SERVING_ONNX_PROVIDERS`` asks for, what can run.

``auto`` (the default) uses CUDA only when it can really run here: a CUDA device is
visible to the driver, and onnxruntime's CUDA provider library and the CUDA/cuDNN
libraries it links against load. Both are checked with ``ctypes`` before onnxruntime is
asked for a session, because the onnxruntime-gpu wheel lists ``CUDAExecutionProvider``
even on hosts without CUDA, and a session asked for it there logs errors and falls back
to the CPU. An explicit list (``cuda,cpu``) that this host cannot honour is an error.

Call these in the worker, after the fork: the CUDA driver does not survive ``fork()``.

Boundary: imports only the standard library (onnxruntime when a check needs it).
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CUDA",
    "CPU",
    "ProviderError",
    "ProviderSelection",
    "cuda_device_count",
    "device_for_worker",
    "parse_providers",
    "provider_problem",
    "select_providers",
]

log = logging.getLogger(__name__)

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
#: Short names accepted in SERVING_ONNX_PROVIDERS; full ONNX Runtime names work too.
SHORT_NAMES = {"cpu": CPU, "cuda": CUDA, "tensorrt": TENSORRT}
#: Providers that need an NVIDIA device, and the onnxruntime library each one loads.
_GPU_LIBRARIES = {
    CUDA: "libonnxruntime_providers_cuda.so",
    TENSORRT: "libonnxruntime_providers_tensorrt.so",
}


class ProviderError(Exception):
    """The providers asked for cannot run on this host; the message says why and what to do."""


def parse_providers(spec: str) -> tuple[str, ...]:
    """``auto`` -> ``()``; ``"tensorrt,cuda,cpu"`` -> the ONNX Runtime names, in order.

    :raises ValueError: naming an entry that is neither a short name (cpu, cuda, tensorrt)
        nor an ONNX Runtime provider name (``...ExecutionProvider``), or an empty list.
    """
    if spec.strip().lower() == "auto":
        return ()
    names = []
    for entry in (part.strip() for part in spec.split(",")):
        full = SHORT_NAMES.get(entry.lower(), entry)
        if not full.endswith("ExecutionProvider"):
            known = ", ".join(SHORT_NAMES)
            raise ValueError(f"unknown execution provider {entry!r} (use auto, or of {known})")
        if full not in names:
            names.append(full)
    return tuple(names)


def cuda_device_count() -> int:
    """CUDA devices the driver shows this process (honouring ``CUDA_VISIBLE_DEVICES``);
    0 when there is no NVIDIA driver. Uses the driver API (``cuInit``,
    ``cuDeviceGetCount``) through ctypes, so nothing is logged on a CPU-only host."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def provider_problem(provider: str) -> str | None:
    """Why ``provider`` cannot run on this host, or ``None`` when it can."""
    import onnxruntime as ort

    if provider not in ort.get_available_providers():
        return (
            f"this onnxruntime build ({ort.__version__}) has no {provider} "
            "(install onnxruntime-gpu for cuda and tensorrt)"
        )
    library = _GPU_LIBRARIES.get(provider)
    if library is None:
        return None
    if cuda_device_count() == 0:
        return "no CUDA device is visible (no NVIDIA driver, or CUDA_VISIBLE_DEVICES hides it)"
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:  # CUDA/cuDNN from the nvidia-* wheels, when installed
        with contextlib.redirect_stdout(io.StringIO()) as said:
            preload(directory="")
        if said.getvalue().strip():
            log.debug("onnxruntime.preload_dlls: %s", said.getvalue().strip())
    try:
        ctypes.CDLL(str(Path(ort.__file__).parent / "capi" / library))
    except OSError as exc:
        from onnxruntime.capi import build_and_package_info

        cuda = getattr(build_and_package_info, "cuda_version", "?")
        return (
            f"{library} cannot be loaded ({exc}); this onnxruntime needs CUDA {cuda} and "
            "cuDNN 9 libraries: pip install 'onnxruntime-gpu[cuda,cudnn]'"
        )
    return None


def device_for_worker(worker_slot: int, n_devices: int, cuda_device: int | None = None) -> int:
    """The CUDA device of worker ``worker_slot``: ``cuda_device`` when set, else
    ``worker_slot mod n_devices``, so workers spread evenly over the GPUs.

    :raises ProviderError: when ``cuda_device`` is not one of the ``n_devices`` devices.
    """
    if cuda_device is None:
        return worker_slot % n_devices
    if not 0 <= cuda_device < n_devices:
        raise ProviderError(
            f"SERVING_CUDA_DEVICE={cuda_device}, but only {n_devices} CUDA device(s) are visible"
        )
    return cuda_device


@dataclass(frozen=True)
class ProviderSelection:
    """The providers (with their options) to create a session with, and the device."""

    providers: list[Any] = field(default_factory=lambda: [CPU])
    device_id: int | None = None


def select_providers(
    spec: str, *, cuda_device: int | None = None, worker_slot: int = 0
) -> ProviderSelection:
    """The providers for ``spec`` (``SERVING_ONNX_PROVIDERS``) on this host.

    GPU providers get ``device_id``: ``cuda_device`` (``SERVING_CUDA_DEVICE``) when set,
    else ``worker_slot mod n_devices``, so worker *k* of a host with *n* GPUs uses device
    *k mod n*.

    :raises ValueError: when ``spec`` does not parse.
    :raises ProviderError: when ``spec`` names a GPU provider this host cannot run, or
        ``cuda_device`` is not a visible device.
    """
    requested = parse_providers(spec)
    if not requested:
        problem = provider_problem(CUDA)
        if problem is not None:
            log.info("execution providers auto: CPU (%s)", problem)
            return ProviderSelection([CPU])
        requested = (CUDA, CPU)
    gpu = [name for name in requested if name in _GPU_LIBRARIES]
    if not gpu:
        return ProviderSelection(list(requested))
    for name in gpu:
        problem = provider_problem(name)
        if problem is not None:
            raise ProviderError(f"SERVING_ONNX_PROVIDERS={spec} asks for {name}, but {problem}")
    device = device_for_worker(worker_slot, cuda_device_count(), cuda_device)
    return ProviderSelection(
        [(name, {"device_id": device}) if name in gpu else name for name in requested], device
    )
