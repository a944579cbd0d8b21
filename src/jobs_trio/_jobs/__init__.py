# What an application declares and a job body calls: the registry, the body's context,
# durable steps and events. Apart because it is the jobs' own side of the run path.
