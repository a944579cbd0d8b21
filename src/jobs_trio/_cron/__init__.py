# Cron tasks: schedules, the task declarations, the scheduler that fires each scheduled time
# once per fleet, and its CLI command. Apart because it is a service beside the worker.
