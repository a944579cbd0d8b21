# The relay: committed outbox rows moved from the application's database into the job store,
# each decided once. Apart because it is a service of its own beside the worker.
