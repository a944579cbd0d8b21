# An order as a durable workflow: charge the card, wait a cooling-off day, wait for the
# warehouse's "shipped" event, then email the customer. Each step runs once, across restarts.
#
#   jobs-trio worker examples.order_workflow --db sqlite:///orders.db
#   jobs-trio enqueue orders.fulfil --app examples.order_workflow --db sqlite:///orders.db \
#       --payload '{"order": "A-1", "amount": 4200}'
# and, from the application, when the warehouse says so:
#   await jobs_trio.send_event(driver, "order.shipped", {"carrier": "dhl"}, key="A-1")
from __future__ import annotations

from typing import Any

import jobs_trio

registry = jobs_trio.Registry()

COOLING_OFF = 24 * 3600  # seconds between charging and handing the order to the warehouse
SHIPPING_WAIT = 7 * 24 * 3600  # how long to wait for the warehouse before giving up


class Services:
    """The outside world, replaceable in tests: a payment provider and a mailer."""

    def charge(self, order: str, amount: int) -> dict[str, Any]:
        return {"charge_id": f"ch_{order}", "amount": amount}

    async def email(self, order: str, text: str) -> str:
        return f"mail_{order}"


services = Services()


@registry.job("orders.fulfil", queue="orders", attempts=5, timeout=60, event_poll=3600)
async def fulfil(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    order = payload["order"]
    # A sync call (a payment SDK) runs in a thread; recorded, so a replay never charges twice.
    charge = await ctx.step.run("charge", services.charge, order, payload["amount"])
    # The attempt ends here (suspended, not counted); the job resumes a day later.
    await ctx.step.sleep("cooling-off", COOLING_OFF)
    try:
        shipped = await ctx.step.wait_for_event(
            "shipped", "order.shipped", match=order, timeout=SHIPPING_WAIT
        )
    except jobs_trio.EventTimedOut:
        mail = await ctx.step.run("email-delay", services.email, order, "your order is late")
        return {"charge": charge, "shipped": None, "mail": mail}
    mail = await ctx.step.run("email", services.email, order, f"shipped with {shipped['carrier']}")
    return {"charge": charge, "shipped": shipped, "mail": mail}
