"""What a finished `%%memwatch` or `%%compare_devices` cell leaves in the kernel.

Runs, in one real Jupyter kernel with one simulated GPU, 200 `%%memwatch` cells and then 200
`%%compare_devices` cells (after warm-up cells of each, which import matplotlib and ipywidgets
and fill their bounded caches: fonts, text metrics), and prints after each batch, with
`gc.collect()` first:
- the kernel's resident memory and its growth over the batch (target: at most a few MB for
  200 cells), and the growth over each quarter of it (a leak grows alike in every quarter,
  a cache that fills up grows less and less);
- the live ipywidgets models and open comms in the kernel (target: no more than before).

A kernel that kept each cell's widgets and figure grew ~1.85 MB per %%memwatch cell
(250 -> 620 MB over 200) and kept 10 widget models per %%memwatch, 15 per %%compare_devices.

Run: .venv/bin/python benchmarks/widget_memory.py [--cells 200] [--warmup 20] [--devlab PATH]
(`--devlab` runs another checkout's devlab in the kernel, e.g. an older one to compare.)
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from jupyter_client.manager import start_new_kernel

ROOT = Path(__file__).resolve().parents[1]

SETUP = """
import gc, json, psutil, torch, devlab
devlab.config.simulate_gpus(1)
get_ipython().run_line_magic("load_ext", "devlab")

def _devlab_probe():
    import ipywidgets
    from ipywidgets.widgets import widget as w
    gc.collect()
    models = getattr(w, "_instances", None)
    if models is None:
        models = ipywidgets.Widget.widgets  # ipywidgets 7
    kernel = get_ipython().kernel
    manager = getattr(kernel, "comm_manager", None)
    comms = len(manager.comms) if manager is not None else -1
    print(json.dumps({"rss": psutil.Process().memory_info().rss, "widgets": len(models),
                      "comms": comms}))
"""

MEMWATCH = "%%memwatch\nx = torch.ones(256, 1024, device='cuda')  # 1 MiB\ndel x"
# The operand is made by --setup on each device: one made before the cell would stay on the CPU,
# which %%compare_devices refuses to call a GPU's time.
COMPARE = ('%%compare_devices /CPU:0 /GPU:0 --setup "a = torch.rand(64, 64)" --warmup 1 '
           "--repeats 1 --min-time 0.01\n"
           "b = a @ a")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=200, help="cells of each magic (200)")
    parser.add_argument("--warmup", type=int, default=20, help="warm-up cells of each (20)")
    parser.add_argument("--devlab", type=Path, default=ROOT,
                        help="the devlab checkout the kernel imports (default: this one)")
    args = parser.parse_args()

    env = dict(os.environ)
    env["PYTHONPATH"] = str(args.devlab.resolve()) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("DEVLAB_SIMULATE_GPUS", None)
    env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    km, kc = start_new_kernel(kernel_name="python3", env=env)
    try:
        run(kc, SETUP)

        def probe() -> dict:
            return json.loads(run(kc, "_devlab_probe()").strip().splitlines()[-1])

        start_rss = probe()["rss"]
        for _ in range(args.warmup):  # imports, first figures, caches
            run(kc, MEMWATCH)
            run(kc, COMPARE)
        before = probe()
        print(f"devlab from {args.devlab}, {args.cells} cells of each magic, one simulated GPU")
        print(f"{f'after {args.warmup} + {args.warmup} warm-up':<28} {_row(before)}  warm-up grew "
              f"{(before['rss'] - start_rss) / 2**20:+.1f} MB")
        for name, cell in (("%%memwatch", MEMWATCH), ("%%compare_devices", COMPARE)):
            start = time.perf_counter()
            quarters = []
            last = before["rss"]
            for i in range(args.cells):
                run(kc, cell)
                if (i + 1) % max(1, args.cells // 4) == 0 and len(quarters) < 4:
                    rss = probe()["rss"]
                    quarters.append((rss - last) / 2**20)
                    last = rss
            seconds = time.perf_counter() - start
            after = probe()
            growth = (after["rss"] - before["rss"]) / 2**20
            print(f"{f'after {args.cells} {name}':<28} {_row(after)}  growth {growth:+7.1f} MB "
                  f"({growth * 1024 / args.cells:+.1f} KB per cell; by quarter "
                  + " ".join(f"{q:+.1f}" for q in quarters) + " MB), "
                  f"widgets {after['widgets'] - before['widgets']:+d}, {seconds:.0f} s")
            before = after
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _row(p: dict) -> str:
    return f"RSS {p['rss'] / 2**20:7.1f} MB, {p['widgets']:5d} widget models, {p['comms']:5d} comms"


def run(kc, code: str, timeout: float = 120) -> str:
    """Execute `code`, wait until the kernel is idle, return its stdout (errors raise)."""
    out: list[str] = []

    def hook(msg: dict) -> None:
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream" and content["name"] == "stdout":
            out.append(content["text"])
        elif kind == "error":
            raise RuntimeError(f"{content['ename']}: {content['evalue']}\nin:\n{code}")

    reply = kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"cell failed: {reply['content']}\nin:\n{code}")
    return "".join(out)


if __name__ == "__main__":
    main()
