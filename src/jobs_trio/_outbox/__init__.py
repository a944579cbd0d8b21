# The application's database: its transaction, the outbox written in it, and the relay that
# moves outbox rows into jobs. Apart because it is a service beside the worker.
