# The public name of the driver contract: `jobs_trio.driver.Driver`, what a driver implements.
# Apart only as that name: the Protocol itself lives with the drivers (drivers/contract.py).
from __future__ import annotations

from .drivers.contract import (
    BesideConnection,
    Capabilities,
    Driver,
    RenewsBeside,
    SettlesWithClaims,
)

__all__ = ["BesideConnection", "Capabilities", "Driver", "RenewsBeside", "SettlesWithClaims"]
