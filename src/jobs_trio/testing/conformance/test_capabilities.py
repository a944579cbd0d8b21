# What a driver declares it does (Capabilities) is what it has: each declared capability's methods
# and keywords are there, so a worker that relies on the declaration never meets a TypeError.
# The tests of each capability skip by the same declaration.
from __future__ import annotations

import inspect

from jobs_trio.driver import Driver

# Each capability: the methods it adds, and the keywords it adds to the contract's methods.
NEEDS: dict[str, dict[str, tuple[str, ...]]] = {
    "settles_with_claims": {"settle_and_claim": ()},
    "claims_ahead": {"claim": ("free",), "renew": ("started",)},
    "rescue_on_request": {
        "claim": ("rescue",),
        "settle_and_claim": (),
        "wait_for_work": ("rescue_from",),
    },
    "renews_beside": {"beside": ()},
    "hands_back_unheld": {"hand_back_unheld": ()},
    "unmarks_alone": {"unmark_alone": ()},
}


async def test_every_declared_capability_is_there(driver: Driver) -> None:
    capabilities = driver.capabilities
    for name, methods in NEEDS.items():
        if not getattr(capabilities, name):
            continue
        for method, keywords in methods.items():
            if method == "settle_and_claim" and not capabilities.settles_with_claims:
                continue
            found = getattr(driver, method, None)
            assert callable(found), f"{name} declared, but {method}() is missing"
            parameters = inspect.signature(found).parameters
            for keyword in keywords:
                assert keyword in parameters, f"{name} declared, but {method}() takes no {keyword}="
    if capabilities.rescue_on_request and capabilities.settles_with_claims:
        assert "rescue" in inspect.signature(driver.settle_and_claim).parameters  # type: ignore[attr-defined]
