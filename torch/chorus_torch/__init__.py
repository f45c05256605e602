"""torch.distributed backend "chorus": collectives over libchorus.

    import chorus_torch            # registers the backend
    torch.distributed.init_process_group("chorus")

CPU tensors; see docs/pytorch.md for what is supported.
"""
import datetime

import torch
import torch.distributed as dist

from ._C import ProcessGroupChorus, version

__all__ = ["ProcessGroupChorus", "version", "BACKEND"]

BACKEND = "chorus"


def _create_process_group(store, rank, world_size, timeout):
    """torch's backend creator: (store, rank, world_size, timeout) -> ProcessGroup."""
    if isinstance(timeout, datetime.timedelta):
        timeout_s = timeout.total_seconds()
    else:
        timeout_s = float(timeout)
    return ProcessGroupChorus(store, rank, world_size, timeout_s)


if BACKEND.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND, _create_process_group)
