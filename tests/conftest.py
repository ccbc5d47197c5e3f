"""Shared fixtures: every op test runs on CPU always and on CUDA when present."""

import os

import torch

if not torch.cuda.is_available():
    # Triton kernels run under the interpreter on CPU; it must be set before they are imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


@pytest.fixture(autouse=True)
def _fresh_seed():
    # Fresh random inputs on every run, printed on failure so a run can be reproduced.
    seed = int(os.environ.get("SPECOPS_TEST_SEED", torch.seed() % (2**31)))
    torch.manual_seed(seed)
    print(f"torch seed {seed} (rerun with SPECOPS_TEST_SEED={seed})")   # shown by pytest on failure
    yield seed
