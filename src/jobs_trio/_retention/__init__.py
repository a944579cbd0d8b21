# Retention: finished jobs deleted after their age, one pruner per fleet at a time, and the
# prune command. Apart because it is a service beside the worker.
