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


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch on one intra-op thread for the module (small tensor ops and tiny matmuls gain
    nothing from threads, and a busy 2-core machine makes OpenMP spin). Use with
    `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
