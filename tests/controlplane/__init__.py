"""A local, secured Kubernetes control plane for integration tests."""

from .certs import CertAuthority, CertPair, apiserver_sans, write_service_account_keys
from .cluster import (
    LOOPBACK,
    SCHEDULER_USER,
    ControlPlane,
    ControlPlaneError,
    ManagedProcess,
    SchedulerHandle,
    free_port,
    free_ports,
    tail,
    wait_until,
)

__all__ = [
    "LOOPBACK",
    "SCHEDULER_USER",
    "CertAuthority",
    "CertPair",
    "ControlPlane",
    "ControlPlaneError",
    "ManagedProcess",
    "SchedulerHandle",
    "apiserver_sans",
    "free_port",
    "free_ports",
    "tail",
    "wait_until",
    "write_service_account_keys",
]
