"""How many threads a CPU trainer gives torch when its run's rollouts overlap its steps.

With `--max-staleness >= 1` (or `--fully-async`) the next step's rollouts are sampled while the
trainer trains. On a CPU host whose vLLM server runs beside the trainer, both then want the
cores at once: torch's default (one thread per core) and vLLM's engine thread oversubscribe
them, and OpenMP threads that lose their core stall every parallel region. Measured on the
2-core machines (the quickstart, `--max-staleness 1`, 16 steps, runs alternating): 1.58 and
1.19 s per step with torch's two threads, 1.03 and 0.96 s with one; synchronous runs, where
training and sampling take turns, keep torch's default.

A GPU trainer, a run whose servers are elsewhere, and a user who set `OMP_NUM_THREADS` are left
alone.
"""

from __future__ import annotations

import os
from typing import Any

from vime.log import get_logger
from vime.procs import usable_cores

log = get_logger(__name__)

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "0.0.0.0")


def threads_beside_rollouts(args: Any, *, cuda: bool, cores: int | None = None,
                            environ: dict[str, str] | None = None) -> int | None:
    """The torch thread count for this trainer, or None to keep torch's own: one core left to
    the local engine when rollouts overlap training on a CPU trainer."""
    environ = os.environ if environ is None else environ
    if cuda or environ.get("OMP_NUM_THREADS"):
        return None
    if not (args.max_staleness >= 1 or args.fully_async):
        return None
    host = args.vllm_router_ip
    if host is not None and host not in LOCAL_HOSTS:
        return None
    cores = cores or usable_cores()
    return cores - 1 if cores >= 2 else None


def apply(args: Any) -> int | None:
    """Set torch's thread count for this trainer process (see `threads_beside_rollouts`)."""
    import torch

    threads = threads_beside_rollouts(args, cuda=torch.cuda.is_available())
    if threads is not None:
        torch.set_num_threads(threads)
        log.info("trainer.threads", threads=threads, why="rollouts overlap training beside a local engine")
    return threads
