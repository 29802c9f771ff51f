"""The modeled clock entered again by the thread that holds its lock (Note [The clock's lock,
entered again by its own thread] in devlab/engine/gpu_model/modeled_clock.py): Python's garbage
collector, started by an allocation inside a section under the lock, runs a finalizer that
touches a simulated GPU. With a plain lock the process waited for itself for ever; now the
nested call runs, and what it charges stays, as if it had come just after the section.

Each program runs in a process of its own, so that a hang is a timeout here, not a hung suite.
The collection is made to land inside the section by hooks the clock calls there: its wall
clock (read under the lock as the host leaves), and the lists a profile or `explain()` gives it
to append each kernel and span to (a profile's are list subclasses with their own `append`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# The program's start: a modeled T4 whose host moves by the model alone (the times below do not
# depend on this machine's speed), a cycle whose finalizer synchronizes, and a collector that
# runs only when asked.
PRELUDE = """
import gc, json, sys
import torch
import devlab
from devlab.engine.simulated.base import session
devlab.config.simulate_gpus(1, model="T4")
clock = session.session.charges.clock
gc.disable()
x = torch.ones(64, 64, device="cuda")
y = x * 2  # a kernel on the stream, so that a synchronize waits for something
state = {"nested": 0, "finalized": 0}
owned = getattr(clock.lock, "_is_owned", None) or clock.lock.locked  # (a plain lock: locked())
class Cycle:
    def __del__(self):
        state["finalized"] += 1
        state["nested"] += owned()
        FINALIZER
def cycle():
    c = Cycle(); c.me = c
cycle()

def collect_once():
    if owned() and not state["nested"] and not state["finalized"]:
        gc.collect()

def times():
    return {"host": clock.host, "free": list(clock.free), "compute": list(clock.compute),
            "busy": list(clock.busy), "held": clock._held}
"""

# Where the collection lands: inside a section (each case's first program) or just after it
# (its second). The fast path's op charges from inside the mode's own call, where torch has
# taken the mode off the stack (a finalizer's op there is the CPU's, on any clock), so the op
# finalizer is collected in `modeled_time()`'s section, outside the mode.
OP = "y = y + 1"
MODELED_TIME = "devlab.simulated.modeled_time()"

WALL = """
real = clock.wall
def wall():
    collect_once()
    return real()
clock.wall = wall
CALL  # the host leaves: the wall clock is read under the lock
clock.wall = real
"""

RECORDING = """
class Collecting(list):
    def append(self, item):
        list.append(self, item)
        collect_once()
with clock.lock:
    clock.recording = Collecting()
CALL  # its kernel is appended to the recording under the lock, after the stream's write
with clock.lock:
    clock.recording = None
"""

AFTER = """
CALL
gc.collect()
"""

FINALIZERS = {
    "synchronize": "torch.cuda.synchronize()",
    "event": "e = torch.cuda.Event(enable_timing=True); e.record(); e.synchronize()",
    "op": "torch.ones(8, device='cuda').add_(1).sum()",
}

CASES = [(WALL, OP, "synchronize"), (WALL, OP, "event"), (RECORDING, OP, "synchronize"),
         (RECORDING, OP, "event"), (WALL, MODELED_TIME, "synchronize"),
         (WALL, MODELED_TIME, "op")]
NAMES = ["fast op, wall clock, synchronize", "fast op, wall clock, event",
         "fast op, recording, synchronize", "fast op, recording, event",
         "modeled_time, wall clock, synchronize", "modeled_time, wall clock, op"]

EPILOGUE = """
print(json.dumps({"state": state, "times": times(), "value": float(y[0, 0])}))
"""


def _run(where: str, call: str, finalizer: str) -> dict:
    program = (PRELUDE.replace("FINALIZER", FINALIZERS[finalizer])
               + where.replace("CALL", call) + EPILOGUE)
    env = {**os.environ, "DEVLAB_HOST_CLOCK": "modeled"}
    try:
        out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                             timeout=120, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("the process hung: the clock's thread waited for its own lock")
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("where", "call", "finalizer"), CASES, ids=NAMES)
def test_a_finalizer_collected_inside_the_clock_runs_and_charges_as_just_after_it(
        where: str, call: str, finalizer: str) -> None:
    nested = _run(where, call, finalizer)
    after = _run(AFTER, call, finalizer)
    # The collection did land inside the section, on the thread holding the lock, and the
    # finalizer ran there (not skipped, not deferred past the process's end).
    assert nested["state"] == {"nested": 1, "finalized": 1}, nested
    assert after["state"] == {"nested": 0, "finalized": 1}, after
    assert nested["value"] == after["value"] == (3.0 if call == OP else 2.0)
    # What the finalizer charged stays: the same modeled times as the finalizer run just after
    # the section (a section writing back a host's time it read before the collection loses
    # the synchronize's wait: the recording's case with `_kernels`' old order).
    assert nested["times"] == after["times"]
    assert nested["times"]["held"] == 0
    if finalizer != "op":  # the host waited for the GPU: its time moved past the kernels'
        assert nested["times"]["host"] >= max(nested["times"]["free"]) > 0.0
    else:  # the op's kernel was charged: the stream moved past the first two ops'
        assert nested["times"]["busy"][0] > _run(AFTER, call, "synchronize")["times"]["busy"][0]


# A collection that starts halfway through the allocator's split (its `Block` made) and frees
# a simulated tensor held in a cycle, whose block is the split segment's neighbour (See Note
# [A free the garbage collector makes inside the allocator] in base/storage_marks.py).
INSIDE_THE_ALLOCATOR = """
import gc, json
import torch
import devlab
from devlab.engine.gpu_model.caching_allocator import state_machine
devlab.config.simulate_gpus(1)
gc.disable()
class Cycle:
    pass
c = Cycle(); c.me = c; c.t = torch.ones(128, device="cuda")  # the segment's first 512 bytes
del c
real = state_machine._new_block
state = {"collected": 0}
def new_block(cls):
    if not state["collected"]:
        state["collected"] = gc.collect()
    return real(cls)
state_machine._new_block = new_block
y = torch.ones(128, device="cuda")  # split off the segment's cached rest
state_machine._new_block = real
allocated = torch.cuda.memory_allocated()
z = torch.ones(256, device="cuda")
del y, z
blocks = [(b["size"], b["state"]) for seg in torch.cuda.memory_snapshot() for b in seg["blocks"]]
print(json.dumps({"collected": state["collected"], "allocated": allocated,
                  "after": torch.cuda.memory_allocated(), "blocks": blocks}))
"""


def test_a_free_the_collector_makes_inside_the_allocator_waits_for_its_call() -> None:
    out = subprocess.run([sys.executable, "-c", INSIDE_THE_ALLOCATOR], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    # The nested free had merged its block with the half-split neighbour: an IndexError the
    # weakref callback swallowed ("Exception ignored in: <function _release ...>").
    assert "Exception ignored" not in out.stderr, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["collected"] > 0
    assert got["allocated"] == 512  # the cycle's block freed by the time the op returned
    # Everything freed merges back into the one 2 MiB segment (the corrupted pool kept two
    # free neighbours apart).
    assert got["after"] == 0 and got["blocks"] == [[2 * 1024 * 1024, "inactive"]], got
