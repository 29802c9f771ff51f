"""What a lesson notebook says when the machine has fewer GPUs than the lesson uses.

Without a GPU, a lesson simulates the GPUs it needs (`devlab.config.simulate_gpus`). With at
least one real GPU devlab does not simulate (a simulated `cuda:0` beside the real `cuda:0`
would be two devices with one name), so on a machine with fewer real GPUs than the lesson
uses, such as Colab's GPU runtime with one, `needs_gpus` tells the learner plainly what will
not run and how to run everything.
"""

from __future__ import annotations

from devlab import config, simulated


def needs_gpus(count: int, what: str) -> None:
    """Say what will not run if there are fewer than `count` GPUs, real or simulated.

    `what` names the lesson's parts that need them ("exercise 4 (two GPUs at once)"). Prints
    nothing when there are enough, and returns nothing, so a cell ending with it shows only
    the message.
    """
    gpus = config.list_physical_devices("GPU")
    if len(gpus) < count:
        print(shortfall_message(count, what, gpus))


def shortfall_message(count: int, what: str, gpus: list[config.PhysicalDevice]) -> str:
    """The plain words of `needs_gpus` for a machine with `gpus` (fewer than `count`)."""
    wanted = f"This notebook uses {count} GPUs"
    if not gpus:
        return (f"{wanted} and this machine has none, so {what} will not run. "
                f"devlab.config.simulate_gpus({count}) simulates them on the CPU.")
    if simulated.is_active():
        return (f"{wanted} and {len(gpus)} simulated GPU{'s are' if len(gpus) != 1 else ' is'} "
                f"running, so {what} will not run. Ask for {count} before the GPUs are first "
                f"used: devlab.config.simulate_gpus({count}).")
    names = ", ".join(_name(g) for g in gpus)
    have = f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''} ({names})"
    return (
        f"{wanted}; this machine has {have}. devlab does not simulate GPUs beside a real one, "
        f"so {what} will not run here (Run All stops there); the other cells run on the real GPU. "
        "To run everything, use a runtime without a GPU (in Colab: Runtime > Change runtime "
        f"type > CPU), where the notebook simulates {count} GPUs."
    )


def _name(gpu: config.PhysicalDevice) -> str:
    short = gpu.name.replace("/physical_device:", "/")
    try:
        name = config.get_device_details(gpu).get("device_name")
    except Exception:  # a driver that will not answer must not stop the lesson
        name = None
    return f"{short}: {name}" if name else short
