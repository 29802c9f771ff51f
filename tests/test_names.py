from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from devlab import DeviceSpec, full_name
from devlab.core.names import VALID_DEVICE_TYPES


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("/GPU:1", "/device:GPU:1"),
        ("/gpu:1", "/device:GPU:1"),
        ("GPU:1", "/device:GPU:1"),
        ("/device:GPU:1", "/device:GPU:1"),
        ("/job:localhost/replica:0/task:0/device:GPU:1", "/job:localhost/replica:0/task:0/device:GPU:1"),
        ("gpu", "/device:GPU:*"),
        ("/GPU:01", "/device:GPU:1"),
        ("/cpu:0", "/device:CPU:0"),
        ("/GPU:*", "/device:GPU:*"),
        ("", ""),
        ("/job:worker/task:3", "/job:worker/task:3"),
        ("/replica:2/job:ps", "/job:ps/replica:2"),
        ("cuda", "/device:GPU:*"),
        ("cuda:1", "/device:GPU:1"),
        ("cpu", "/device:CPU:*"),
        ("mps", "/device:MPS:*"),
        # TensorFlow upper-cases the lowercase types cpu and gpu, and only those.
        ("/device:gpu:0", "/device:GPU:0"),
        ("/device:cpu:0", "/device:CPU:0"),
        ("/device:gpu:*", "/device:GPU:*"),
        ("/job:localhost/replica:0/task:0/device:cpu:0", "/job:localhost/replica:0/task:0/device:CPU:0"),
        ("/job:localhost/replica:0/task:0/device:gpu:1", "/job:localhost/replica:0/task:0/device:GPU:1"),
        ("/device:tpu:0", "/device:tpu:0"),
        ("/device:Gpu:0", "/device:Gpu:0"),
    ],
)
def test_parses_tensorflow_and_torch_names_to_canonical_form(text: str, canonical: str) -> None:
    assert DeviceSpec.from_string(text).to_string() == canonical


def test_fields_match_tensorflow() -> None:
    spec = DeviceSpec.from_string("/job:localhost/replica:0/task:0/device:GPU:1")
    assert (spec.job, spec.replica, spec.task, spec.device_type, spec.device_index) == ("localhost", 0, 0, "GPU", 1)
    assert DeviceSpec.from_string("/GPU").device_index is None
    assert repr(DeviceSpec.from_string("/GPU:1")) == (
        "<DeviceSpec(job=None, replica=None, task=None, device_type=GPU, device_index=1)>"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("/foo:1", "Unknown attribute 'foo' is encountered while parsing the device spec: '/foo:1'."),
        # TensorFlow skips such a part unread (Hypothesis found ':;' accepted as the empty spec)
        ("/GPU:0/:;", "The part ':;' of the device spec '/GPU:0/:;' names no attribute: a part is "
                      "job:NAME, replica:N, task:N, device:TYPE:N or TYPE[:N]."),
        ("/cpu:0/gpu:1", "Multiple device types are not allowed while parsing the device spec: /cpu:0/gpu:1."),
        ("/device:GPU", "Unknown attribute 'device' is encountered while parsing the device spec: '/device:GPU'."),
        ("/GPU:x", "Invalid device index 'x' while parsing the device spec: '/GPU:x'"),
        ("/replica:a", "Invalid replica 'a'"),
        ("cuda:x", "Invalid device index 'x' in the torch device name 'cuda:x'"),
    ],
)
def test_rejects_what_tensorflow_rejects_with_its_words(text: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        DeviceSpec.from_string(text)
    assert message in str(err.value)


def test_lowercase_cpu_and_gpu_are_the_uppercase_devices_however_the_spec_is_made() -> None:
    assert DeviceSpec.from_string("/device:gpu:1") == DeviceSpec.from_string("/GPU:1")
    assert DeviceSpec(device_type="gpu", device_index=1).to_string() == "/device:GPU:1"
    assert DeviceSpec.from_string("/TPU:0").replace(device_type="cpu").device_type == "CPU"
    assert full_name("/device:gpu:1") == "/job:localhost/replica:0/task:0/device:GPU:1"
    assert DeviceSpec.from_string("/device:cpu:0").to_torch() == torch.device("cpu")


@pytest.mark.parametrize(
    "text",
    [
        "/GPU:" + "1" * 5000,  # more digits than int() converts
        "/device:GPU:" + "1" * 5000,
        "cuda:" + "1" * 5000,
        "/replica:" + "9" * 5000,
        "/foo" + "x" * 5000,
        "/GPU:0/CPU:" + "0" * 5000,
    ],
)
def test_errors_about_over_long_input_quote_only_its_ends(text: str) -> None:
    with pytest.raises(ValueError) as err:
        DeviceSpec.from_string(text)
    message = str(err.value)
    assert len(message) < 400
    assert f"({len(text):,} characters)" in message
    assert "…" + text[-20:] in message


def test_an_index_of_too_many_digits_says_so() -> None:
    with pytest.raises(ValueError) as err:
        DeviceSpec.from_string("/GPU:" + "1" * 5000)
    assert "Invalid device index '" in str(err.value)
    assert "it is too long for a number; use a small whole number such as 0 or 1." in str(err.value)
    assert "must be a whole number" not in str(err.value)


@pytest.mark.parametrize("index", ["128", "4294967296", "1" * 4000])
def test_to_torch_rejects_an_index_torch_would_wrap_into_another_device(index: str) -> None:
    # torch.device("cuda", 128) is cuda:-128 and torch.device("cuda", 2**32) is cuda:0.
    with pytest.raises(ValueError, match="has a device index no torch device can have") as err:
        DeviceSpec.from_string(f"/GPU:{index}").to_torch()
    assert len(str(err.value)) < 300
    assert DeviceSpec.from_string("/GPU:127").to_torch() == torch.device("cuda", 127)


def test_short_input_is_echoed_whole() -> None:
    text = "/job:localhost/replica:0/task:0/device:GPU:1/foo:2"
    with pytest.raises(ValueError) as err:
        DeviceSpec.from_string(text)
    assert str(err.value) == f"Unknown attribute 'foo' is encountered while parsing the device spec: '{text}'."


def test_non_string_is_a_type_error_naming_what_is_expected() -> None:
    with pytest.raises(TypeError, match="must be a string such as '/GPU:0'"):
        DeviceSpec.from_string(3)  # type: ignore[arg-type]


def test_to_torch_and_back() -> None:
    assert DeviceSpec.from_string("/GPU:1").to_torch() == torch.device("cuda", 1)
    assert DeviceSpec.from_string("/GPU").to_torch() == torch.device("cuda", 0)
    assert DeviceSpec.from_string("/CPU:0").to_torch() == torch.device("cpu")
    assert DeviceSpec.from_torch(torch.device("cuda", 3)).to_string() == "/device:GPU:3"
    assert DeviceSpec.from_torch("cpu").to_string() == "/device:CPU:0"
    with pytest.raises(ValueError, match="names a remote device"):
        DeviceSpec.from_string("/job:worker/device:GPU:0").to_torch()
    with pytest.raises(ValueError, match="Device type 'TPU' has no PyTorch device"):
        DeviceSpec.from_string("/TPU:0").to_torch()
    with pytest.raises(ValueError, match="names no device type"):
        DeviceSpec.from_string("/job:localhost").to_torch()


def test_full_name_of_strings_specs_devices_and_tensors() -> None:
    full = "/job:localhost/replica:0/task:0/device:GPU:1"
    assert full_name("/GPU:1") == full
    assert full_name(DeviceSpec.from_string("cuda:1")) == full
    assert full_name(torch.device("cuda:1")) == full
    assert full_name(torch.ones(1)) == "/job:localhost/replica:0/task:0/device:CPU:0"
    assert full_name("gpu") == "/job:localhost/replica:0/task:0/device:GPU:0"


def test_parsing_never_initializes_cuda() -> None:
    DeviceSpec.from_string("/GPU:3").to_torch()
    full_name("cuda:2")
    assert not torch.cuda.is_initialized()


_types = st.sampled_from(sorted(VALID_DEVICE_TYPES))
_specs = st.builds(
    DeviceSpec,
    job=st.none() | st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True),
    replica=st.none() | st.integers(0, 99),
    task=st.none() | st.integers(0, 99),
    device_type=st.none() | _types,
    device_index=st.none() | st.integers(0, 99),
).filter(lambda s: s.device_type is not None or s.device_index is None)


@given(_specs)
def test_round_trip_through_the_canonical_string(spec: DeviceSpec) -> None:
    assert DeviceSpec.from_string(spec.to_string()) == spec


@given(_types, st.none() | st.integers(0, 99), st.booleans(), st.booleans())
def test_short_forms_mean_the_same_device(device_type: str, index: int | None, lower: bool, slash: bool) -> None:
    name = device_type.lower() if lower else device_type
    text = ("/" if slash else "") + name + ("" if index is None else f":{index}")
    spec = DeviceSpec.from_string(text)
    assert spec == DeviceSpec(device_type=device_type, device_index=index)
    assert DeviceSpec.from_string(spec.to_string()) == spec


@given(st.sampled_from(["cpu", "cuda"]), st.integers(0, 15))
def test_torch_round_trip(kind: str, index: int) -> None:
    device = torch.device("cpu") if kind == "cpu" else torch.device(kind, index)
    assert DeviceSpec.from_torch(device).to_torch() == device


# -- the one rule (names.py's docstring), and the issue's cases as they were written ------------

def test_issue_16_device_strings_as_written() -> None:
    from devlab import resolve

    # full_name('') returned a name while resolve('') raised: both refuse, in the same words.
    with pytest.raises(ValueError) as by_name:
        full_name("")
    with pytest.raises(ValueError) as by_resolve:
        resolve("")
    assert str(by_name.value) == str(by_resolve.value)
    assert "names no device type" in str(by_name.value)
    # '/GPU:0\n' was accepted and '  /GPU:0 ' rejected: surrounding whitespace is refused alike.
    for text in ("/GPU:0\n", "  /GPU:0 "):
        with pytest.raises(ValueError, match="has whitespace around it; write it without: '/GPU:0'"):
            DeviceSpec.from_string(text)
    # '/GPU:٣' gave GPU:3 (int() takes any Unicode digit).
    with pytest.raises(ValueError, match="write numbers with the ASCII digits 0-9: '/GPU:3'"):
        DeviceSpec.from_string("/GPU:٣")
    # full_name('/GPU:-1') gave …GPU:-1.
    with pytest.raises(ValueError, match="a device index is 0 or more"):
        full_name("/GPU:-1")
    # to_torch('/CPU:1') gave cpu.
    with pytest.raises(ValueError, match="names no torch device: torch has one cpu device"):
        DeviceSpec.from_string("/CPU:1").to_torch()


@pytest.mark.parametrize("text", [
    "/GPU:+1", "/GPU:1_0", "/GPU: 1", "cuda:-1", "cuda:²", "/replica:-2", "/task:٣",
    "/job:my-job/GPU:0", "/job:/GPU:0", "/device:G PU:0", "/device:1GPU:0", "/GPU:0\x00",
    "/GPU:１",  # a full-width digit
])
def test_only_ascii_digits_and_identifiers(text: str) -> None:
    with pytest.raises(ValueError) as err:
        DeviceSpec.from_string(text)
    assert "\n" not in str(err.value)  # one line, even for a name with a newline in it


def test_specs_made_by_hand_follow_the_rule() -> None:
    for fields in ({"device_index": -1}, {"replica": -1}, {"task": True},
                   {"job": "my job"}, {"device_type": "G-PU"}):
        with pytest.raises(ValueError):
            DeviceSpec(**fields)
    assert DeviceSpec(job="worker_1", device_type="gpu", device_index=0).to_string() == (
        "/job:worker_1/device:GPU:0")


def test_one_device_types_have_index_zero_only() -> None:
    assert DeviceSpec.from_string("/CPU:0").to_torch() == torch.device("cpu")
    assert DeviceSpec.from_string("cpu").to_torch() == torch.device("cpu")
    with pytest.raises(ValueError, match="Use /MPS:0"):
        DeviceSpec.from_string("/MPS:1").to_torch()


_ACCEPTED = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:/*_")


@given(st.text(max_size=40) | st.text(alphabet=sorted(_ACCEPTED) + [" ", "\n", "-", "٣"], max_size=30))
def test_any_text_is_a_name_or_one_valueerror(text: str) -> None:
    try:
        spec = DeviceSpec.from_string(text)
    except ValueError as e:
        assert str(e) and "\n" not in str(e)
        return
    # What is accepted is written in the rule's characters, and means its canonical form.
    assert set(text) <= _ACCEPTED
    assert DeviceSpec.from_string(spec.to_string()) == spec
    # full_name and resolve agree on what names a device.
    if spec.device_type is None:
        with pytest.raises(ValueError, match="names no device type"):
            full_name(text)
    else:
        assert full_name(text) == spec.full().to_string()


@given(st.sampled_from(["/GPU:0", "cuda:1", "/device:CPU:0", "gpu", ""]),
       st.sampled_from([" ", "\n", "\t", "\r\n", "\u00a0"]), st.booleans())
def test_surrounding_whitespace_is_refused_one_way(name: str, space: str, before: bool) -> None:
    text = space + name if before else name + space
    with pytest.raises(ValueError, match="whitespace") as refused:
        DeviceSpec.from_string(text)
    # What the error suggests instead is itself a name (never the empty one, which names no
    # device).
    assert "write it without: ''" not in str(refused.value)
