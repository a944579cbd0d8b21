# What an application declares and enqueues into: the registry of jobs and tasks, the outbox
# enqueue target, events sent. Apart because the run path reads it, never the other way.
