"""The caching allocator's out-of-memory error, with the figures and the words of CUDA's
(`DeviceCachingAllocator::malloc`, `format_size` in `CUDACachingAllocator.cpp`)."""

from __future__ import annotations


class OutOfMemory(Exception):
    """A request the allocator could not satisfy, with the figures of CUDA's message."""

    def __init__(self, device: int, alloc_size: int, total: int, free: int, allocated: int,
                 reserved: int, allowed: int | None, process_bytes: int,
                 in_private_pools: int = 0) -> None:
        self.device = device
        self.in_private_pools = in_private_pools
        self.alloc_size = alloc_size
        self.total = total
        self.free = free
        self.allocated = allocated
        self.reserved = reserved
        self.allowed = allowed
        self.process_bytes = process_bytes
        super().__init__(self.message())

    def message(self, pid: int | None = None, others: tuple[tuple[int, int], ...] = ()) -> str:
        """CUDA's out-of-memory message (`DeviceCachingAllocator::malloc`). With `pid` (this
        process's, as NVML lists it), the processes' lines of `reportProcessMemoryInfo`: this
        process's own in its words, then "Process N has ..." for each (pid, bytes) of `others`,
        the other processes on the GPU."""
        proc = "" if pid is None else "".join(
            [f"Including non-PyTorch memory, this process has {format_size(self.process_bytes)} "
             "memory in use. "] + [f"Process {p} has {format_size(b)} memory in use. "
                                   for p, b in others if p != pid])
        allowed = "" if self.allowed is None else f"{format_size(self.allowed)} allowed; "
        # The cached blocks of private pools count as allocated, as CUDA's message counts them.
        private = self.in_private_pools
        pools = (f"with {format_size(private)} allocated in private pools (e.g., CUDA Graphs), "
                 if private > 0 else "")
        return (f"CUDA out of memory. Tried to allocate {format_size(self.alloc_size)}. GPU "
                f"{self.device} has a total capacity of {format_size(self.total)} of which "
                f"{format_size(self.free)} is free. {proc}{allowed}Of the allocated memory "
                f"{format_size(self.allocated + private)} is allocated by PyTorch, {pools}and "
                f"{format_size(self.reserved - self.allocated - private)} is reserved by "
                "PyTorch but "
                "unallocated. If reserved but unallocated memory is large try setting "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
                "documentation for Memory Management  "
                "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


def format_size(size: int) -> str:
    """A byte count as CUDA's allocator writes it (`format_size`)."""
    if size <= 1024:
        return f"{size} bytes"
    if size <= 1048576:
        return f"{size / 1024.0:.2f} KiB"
    if size <= 1073741824:
        return f"{size / 1048576.0:.2f} MiB"
    return f"{size / 1073741824.0:.2f} GiB"
