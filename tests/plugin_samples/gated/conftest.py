import pytest
import torch

# Read when pytest imports this conftest, before collection: the plugin started the GPUs earlier.
CUDA_WHEN_CONFTEST_LOADED = torch.cuda.is_available()


@pytest.fixture
def cuda_when_conftest_loaded():
    return CUDA_WHEN_CONFTEST_LOADED
