"""pytest plugin: each test starts on the portable (sm80) attention kernels, on Hopper devices too, and the dispatcher's
choice is restored after it; for running the GPU tests of the portable path on a Hopper machine:
    PYTHONPATH=tests python -m pytest -p force_portable tests/test_attention_backward_gpu.py
Tests that assert the dispatcher's Hopper choice (the launch plans in test_attention_features_gpu.py) fail under it."""
import pytest

import flashsci


@pytest.fixture(autouse=True)
def _portable_attention_kernels():
    """The portable kernels for this test."""
    flashsci._flashsci._set_attention_kernel("sm80")
    yield
    flashsci._flashsci._set_attention_kernel("auto")
