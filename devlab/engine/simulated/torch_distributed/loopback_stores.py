"""torch.distributed's stores in a simulated process: asked for on loopback, they listen there.

torch's TCPStore server binds every interface, whatever host it is given: `torchrun --standalone`
(its rendezvous endpoint "localhost:0") leaves two unauthenticated stores listening on every
interface while it runs, the rendezvous store (whose state torch's keep-alive thread unpickles)
and the workers' store. In a process with simulated GPUs, which `python -m devlab run` and
`DEVLAB_SIMULATE_GPUS=N torchrun` both are:

- a TCPStore server (torchrun's, `init_process_group`'s env:// store) whose host is loopback
  ("localhost", 127.0.0.1, ::1) listens on a socket bound to that host only (`master_listen_fd`), as devlab's own launcher does; a store on
  another host, a multi-node run's, is torch's as it was;
- torchrun's agent, when its rendezvous endpoint is loopback (`--standalone`, or the static
  default 127.0.0.1) and `--local-addr` is not given, names its node by loopback rather than by
  the machine's name: every node of such a run is on this machine (none could reach the
  rendezvous otherwise), and the workers' store it makes at that address then listens on
  loopback too (on a machine whose name resolves to a network address, Binder's and Colab's,
  it listened there);
- gloo under devlab's NCCL group binds loopback when the group's store is a TCPStore on loopback
  and GLOO_SOCKET_IFNAME does not say otherwise (gloo binds the address the machine's name
  resolves to, a network one on Binder and Colab): its peers are on this machine.
"""

from __future__ import annotations

import errno
import functools
import sys
from collections.abc import Callable
from datetime import timedelta
from types import ModuleType
from typing import Any

from torch.distributed import PrefixStore, TCPStore

from devlab._helpers.loopback import is_loopback, loopback_socket
from devlab.engine.simulated.base.import_patches import when_imported
from devlab.engine.simulated.base.patcher import Patcher
from devlab.engine.simulated.mode.device_queries import stand_in

LAUNCHER = "torch.distributed.launcher.api"
LOOPBACK = "127.0.0.1"


def _on_loopback(real: type) -> Callable[..., Any]:
    """TCPStore(...) whose server, on a loopback host, listens on that host only."""

    def make(host_name: str, port: int, world_size: int | None = None,
             is_master: bool = False, timeout: timedelta = timedelta(seconds=300),
             wait_for_workers: bool = True, multi_tenant: bool = False,
             master_listen_fd: int | None = None, use_libuv: bool = True) -> Any:
        def store(port: int, fd: int | None) -> Any:
            return real(host_name, port, world_size, is_master, timeout, wait_for_workers,
                        multi_tenant, fd, use_libuv)

        if not is_master or master_listen_fd is not None or not is_loopback(host_name):
            return store(port, master_listen_fd)
        try:
            sock = loopback_socket(host_name, int(port))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
            # torch's own answer: a multi-tenant server this process already has, or its error
            return store(port, None)
        try:
            made = store(sock.getsockname()[1], sock.fileno())
        except BaseException:
            sock.close()
            raise
        sock.detach()  # the store's server owns it now
        return made

    return make


def _local_node(original: Callable[..., Any]) -> Callable[..., Any]:
    """torchrun's launch_agent, naming a run's node by loopback when its rendezvous is."""

    @functools.wraps(original)
    def launch_agent(config: Any, *args: Any, **kwargs: Any) -> Any:
        if not config.local_addr and config.rdzv_endpoint:
            from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

            host, _ = parse_rendezvous_endpoint(config.rdzv_endpoint, default_port=0)
            if is_loopback(host):
                config.local_addr = LOOPBACK
        return original(config, *args, **kwargs)

    return launch_agent


def loopback_store(store: Any) -> bool:
    """Whether `store` (through its prefixes) is a TCPStore on a loopback host: every process
    that uses it is on this machine."""
    while isinstance(store, PrefixStore):
        store = store.underlying_store
    return isinstance(store, TCPStore) and is_loopback(store.host)


def install(p: Patcher) -> None:
    import torch.distributed as dist

    if not dist.is_available():
        return
    real = dist.TCPStore
    ours = stand_in(real, _on_loopback(real))
    # where torch's modules hold the name (torch.distributed.rendezvous: init_process_group's
    # env:// store); modules imported later take it from torch.distributed
    for name, module in list(sys.modules.items()):
        if name.startswith("torch.distributed") and getattr(module, "TCPStore", None) is real:
            p.set(module, "TCPStore", ours)

    def patch_launcher(module: ModuleType) -> None:
        p.set(module, "launch_agent", _local_node(module.launch_agent))

    when_imported(p, LAUNCHER, patch_launcher)
