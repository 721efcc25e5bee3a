"""Multi-process (multi-host) start-up: `jax.distributed.initialize` when a run spans several processes.

Every process of a run calls `maybe_initialize` once, before any other JAX call, with the same
`num_processes` and `coordinator_address` (host:port of process 0) and its own `process_id`. Afterwards
`jax.devices()` lists the devices of all processes and a `searchjax.sharding.make_mesh` over them is global:
jitted functions run SPMD across processes, each process feeding and reading its addressable shards.
A single-process run (num_processes = 1) initialises nothing.
"""

from __future__ import annotations

import dataclasses

import jax


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """How many processes a run spans, which one this is, and where process 0 coordinates."""

    num_processes: int = 1
    process_id: int = 0
    coordinator_address: str | None = None
    initialization_timeout_s: int = 300

    def __post_init__(self):
        if self.num_processes < 1:
            raise ValueError(f"distributed.num_processes must be >= 1, got {self.num_processes}")
        if not 0 <= self.process_id < self.num_processes:
            raise ValueError(
                f"distributed.process_id must be in [0, {self.num_processes}), got {self.process_id}"
            )
        if self.num_processes > 1:
            host, sep, port = (self.coordinator_address or "").rpartition(":")
            if not (host and sep and port.isdigit()):
                raise ValueError(
                    "distributed.coordinator_address must be 'host:port' when num_processes > 1, "
                    f"got {self.coordinator_address!r}"
                )


def maybe_initialize(
    num_processes: int = 1,
    process_id: int = 0,
    coordinator_address: str | None = None,
    *,
    initialization_timeout_s: int = 300,
) -> bool:
    """Call `jax.distributed.initialize` if the run spans several processes; return whether it did.

    Raises ValueError (naming the field) for an inconsistent configuration.
    """
    cfg = DistributedConfig(num_processes, process_id, coordinator_address, initialization_timeout_s)
    return initialize_from_config(cfg)


def initialize_from_config(cfg: DistributedConfig) -> bool:
    """`maybe_initialize` for a `DistributedConfig` (e.g. the `distributed:` section of a run's YAML)."""
    if cfg.num_processes == 1:
        return False
    jax.distributed.initialize(
        coordinator_address=cfg.coordinator_address,
        num_processes=cfg.num_processes,
        process_id=cfg.process_id,
        initialization_timeout=cfg.initialization_timeout_s,
    )
    return True
