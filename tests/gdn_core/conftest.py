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


@pytest.fixture(autouse=True, scope="module")
def gloo_worlds(request):
    """Start the spawned gloo worlds (torch_dist) before a module that runs jobs on them: the
    session's one-off ~10 s of process start-up is set-up, not the first test's call."""
    if "run_in_process_group" in vars(request.module):
        from .torch_dist import start_worlds

        start_worlds(2, 4)
    yield
