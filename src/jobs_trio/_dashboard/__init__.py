# The web dashboard's implementation (jobs_trio.dashboard is its public face). Apart
# because it needs the dashboard extra (Starlette, hypercorn, Jinja2).
