# The packaged conformance suite (jobs_trio.testing.conformance), run here as a third-party
# driver's tests run it: one import, and conftest.py's driver_factory for the three drivers.
from jobs_trio.testing.conformance import *  # noqa: F403
