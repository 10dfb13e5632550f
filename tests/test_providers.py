"""Execution-provider selection: parsing SERVING_ONNX_PROVIDERS, devices, CPU-only hosts."""

from __future__ import annotations

import pytest

from serving.model.providers import (
    CPU,
    CUDA,
    TENSORRT,
    ProviderError,
    cuda_device_count,
    device_for_worker,
    parse_providers,
    provider_problem,
    select_providers,
)
from tests.test_boundaries import fresh_python

NO_USABLE_GPU = provider_problem(CUDA) is not None


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("auto", ()),
        (" AUTO ", ()),
        ("cpu", (CPU,)),
        ("cuda,cpu", (CUDA, CPU)),
        ("tensorrt, cuda, cpu", (TENSORRT, CUDA, CPU)),
        ("CUDAExecutionProvider,cpu,cuda", (CUDA, CPU)),
    ],
)
def test_parse_providers_accepts_short_and_full_names(spec: str, expected: tuple[str]) -> None:
    assert parse_providers(spec) == expected


@pytest.mark.parametrize("spec", ["gpu", "cuda,,cpu", "", "cpu;cuda"])
def test_parse_providers_names_the_unknown_entry(spec: str) -> None:
    with pytest.raises(ValueError, match="unknown execution provider"):
        parse_providers(spec)


def test_device_for_worker_spreads_workers_over_gpus() -> None:
    assert [device_for_worker(slot, 2) for slot in range(5)] == [0, 1, 0, 1, 0]
    assert [device_for_worker(slot, 3) for slot in range(4)] == [0, 1, 2, 0]
    assert [device_for_worker(slot, 4, cuda_device=3) for slot in range(3)] == [3, 3, 3]


def test_device_for_worker_refuses_a_device_that_is_not_there() -> None:
    with pytest.raises(ProviderError, match="SERVING_CUDA_DEVICE=2, but only 2 CUDA"):
        device_for_worker(0, 2, cuda_device=2)


def test_cpu_only_list_selects_the_cpu_without_looking_for_a_gpu() -> None:
    selection = select_providers("cpu", worker_slot=3)
    assert (selection.providers, selection.device_id) == ([CPU], None)


@pytest.mark.skipif(not NO_USABLE_GPU, reason="this host has a usable GPU")
def test_auto_on_a_host_without_a_usable_gpu_selects_the_cpu() -> None:
    assert select_providers("auto").providers == [CPU]


@pytest.mark.skipif(not NO_USABLE_GPU, reason="this host has a usable GPU")
@pytest.mark.parametrize("spec", ["cuda", "cuda,cpu", "tensorrt,cuda,cpu"])
def test_explicit_gpu_provider_on_a_host_without_one_is_an_error(spec: str) -> None:
    with pytest.raises(ProviderError, match=rf"SERVING_ONNX_PROVIDERS={spec} asks for \w+, but"):
        select_providers(spec)


def test_cuda_device_count_is_zero_or_more_without_raising() -> None:
    # In a fresh interpreter: the check must not need onnxruntime or torch loaded first.
    count = int(
        fresh_python("from serving.model.providers import cuda_device_count as c; print(c())")
    )
    assert count == cuda_device_count() >= 0
