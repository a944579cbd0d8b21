# The run path: claiming, running, settling, draining, leases, outages.
