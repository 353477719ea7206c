"""Fixtures for the gdn_core tests."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    """One intra-op thread: on a shared 2-core host two threads spin-wait, 5-20x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
