"""A local, secured Kubernetes control plane for integration tests."""

from .certs import CertAuthority
from .certs import CertPair
from .certs import apiserver_sans
from .certs import write_service_account_keys
from .cluster import LOOPBACK
from .cluster import SCHEDULER_USER
from .cluster import ControlPlane
from .cluster import ControlPlaneError
from .cluster import ManagedProcess
from .cluster import SchedulerHandle
from .cluster import free_port
from .cluster import free_ports
from .cluster import tail
from .cluster import wait_until

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
