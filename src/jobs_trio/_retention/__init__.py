# Retention: finished jobs deleted after their age, one pruner per fleet at a time. Apart
# because it is a service the worker runs beside its claims.
