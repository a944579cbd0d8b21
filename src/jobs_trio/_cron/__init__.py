# Cron tasks: schedules, the task declarations, and the scheduler that fires each scheduled
# time once per fleet. Apart because it is a service the worker runs beside its claims.
