"""The compute capability's rules on a modeled GPU, as torch's CUDA build applies them: bf16
(`is_bf16_supported`, with and without emulation), fp8 (`torch._scaled_mm` below cc 8.9) and
SDPA's backends (flash attention below sm80: torch's warnings and "No available kernel")."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import devlab
from devlab.engine.simulated.cuda import capability

pytestmark = pytest.mark.usefixtures("no_simulation")

FLASH_SM = ("Flash attention only supports gpu architectures in the range [sm80, sm121]. "
            "Attempting to run on a sm {} gpu.")


@pytest.fixture(params=["T4", "V100", "A100", "L4", "H100"])
def board(request):
    devlab.config.simulate_gpus(1, model=request.param)
    yield request.param, torch.cuda.get_device_capability()
    devlab.config.stop_simulation()


def _fp8_pair() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    a = torch.randn(16, 32, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(16, 32, device="cuda").to(torch.float8_e4m3fn).t()
    return a, b, torch.tensor(1.0, device="cuda")


def test_bf16_as_torch_reads_the_board(board):
    _, cc = board
    assert torch.cuda.is_bf16_supported() is True  # CUDA makes a bf16 tensor on every board
    assert torch.cuda.is_bf16_supported(including_emulation=False) is (cc >= (8, 0))


def test_scaled_mm_needs_cc_8_9(board):
    name, cc = board
    a, b, scale = _fp8_pair()
    if cc >= (9, 0) or cc == (8, 9):
        out = torch._scaled_mm(a, b, scale, scale, out_dtype=torch.bfloat16)
        expected = (a.float() @ b.float()).to(torch.bfloat16)
        assert out.device.type == "cuda" and torch.equal(out.cpu(), expected.cpu())
    else:
        with pytest.raises(RuntimeError, match=r"^torch\._scaled_mm is only supported on CUDA "
                           r"devices with compute capability >= 9\.0 or 8\.9, or ROCm MI300\+$"):
            torch._scaled_mm(a, b, scale, scale, out_dtype=torch.bfloat16)


def _sdpa(backend: SDPBackend, dtype: torch.dtype, **kwargs):
    q = torch.randn(2, 4, 8, 16, device="cuda", dtype=dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(q, q, q, **kwargs)
        except RuntimeError as e:
            return e, [str(w.message) for w in caught], [w.filename for w in caught]
    host = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    expected = F.scaled_dot_product_attention(q.cpu().float(), q.cpu().float(), q.cpu().float(),
                                              **host)
    torch.testing.assert_close(out.cpu().float(), expected, atol=2e-2, rtol=2e-2)
    return out, [str(w.message) for w in caught], []


def test_flash_attention_needs_sm80(board):
    name, cc = board
    got, said, files = _sdpa(SDPBackend.FLASH_ATTENTION, torch.float16)
    if cc >= (8, 0):
        assert isinstance(got, torch.Tensor) and got.device.type == "cuda"
        return
    assert str(got) == "No available kernel. Aborting execution."
    assert said == ["Memory efficient kernel not used because:",
                    "Memory Efficient attention has been runtime disabled.",
                    "Flash attention kernel not used because:",
                    FLASH_SM.format(f"{cc[0]}.{cc[1]}"),
                    "cuDNN attention kernel not used because:",
                    "cuDNN attention has been runtime disabled."]
    assert set(files) == {__file__}  # at the caller's line, as TORCH_WARN's


def test_flash_attention_refuses_float32_on_every_board(board):
    _, cc = board
    got, said, _ = _sdpa(SDPBackend.FLASH_ATTENTION, torch.float32)
    assert isinstance(got, RuntimeError)
    assert said[3] == (FLASH_SM.format(f"{cc[0]}.{cc[1]}") if cc < (8, 0) else
                       "Expected query, key and value to all be of dtype: {Half, BFloat16}. Got "
                       "Query dtype: float, Key dtype: float, and Value dtype: float instead.")


def test_memory_efficient_attention_runs_and_refuses_bf16_before_sm80(board):
    # The CPU has no memory-efficient kernel: on a simulated GPU it ran nowhere before.
    _, cc = board
    got, _, _ = _sdpa(SDPBackend.EFFICIENT_ATTENTION, torch.float32)
    assert isinstance(got, torch.Tensor)
    got, said, _ = _sdpa(SDPBackend.EFFICIENT_ATTENTION, torch.bfloat16)
    if cc >= (8, 0):
        assert isinstance(got, torch.Tensor)
    else:
        assert isinstance(got, RuntimeError)
        assert said[1] == ("Expected query, key and value to all be of dtype: {Half, Float}. Got "
                           "Query dtype: c10::BFloat16, Key dtype: c10::BFloat16, and Value "
                           "dtype: c10::BFloat16 instead.")


def test_flash_refuses_a_mask_and_the_math_backend_takes_anything(board):
    mask = torch.ones(8, 8, dtype=torch.bool, device="cuda").tril()
    got, said, _ = _sdpa(SDPBackend.FLASH_ATTENTION, torch.float16, attn_mask=mask)
    assert isinstance(got, RuntimeError)
    assert "Flash Attention does not support non-null attn_mask." in said
    got, said, _ = _sdpa(SDPBackend.MATH, torch.float16, attn_mask=mask)
    assert isinstance(got, torch.Tensor) and not said
    assert torch.backends.cuda.math_sdp_enabled()  # the call left torch's flags as they were


def test_sdpa_with_every_backend_off_says_so():
    devlab.config.simulate_gpus(1, model="A100")
    q = torch.randn(1, 1, 4, 8, device="cuda", dtype=torch.float16)
    try:
        with sdpa_kernel([]), pytest.raises(RuntimeError, match="^" + capability.NO_BACKEND):
            F.scaled_dot_product_attention(q, q, q)
    except (ValueError, RuntimeError):  # a torch that refuses an empty list of backends
        pytest.skip("sdpa_kernel([]) is refused by this torch")
    finally:
        devlab.config.stop_simulation()


def test_without_a_model_no_board_rules_apply():
    devlab.config.simulate_gpus(1)
    try:
        assert torch.cuda.get_device_capability() == (0, 0)
        a, b, scale = _fp8_pair()
        assert torch._scaled_mm(a, b, scale, scale, out_dtype=torch.bfloat16).shape == (16, 16)
        got, said, _ = _sdpa(SDPBackend.EFFICIENT_ATTENTION, torch.float16)
        assert isinstance(got, torch.Tensor) and not said
    finally:
        devlab.config.stop_simulation()
