# The run path: a worker claims a job (claim_loop), holds a slot for it (slots), runs it
# (worker, attempt, run_scope), settles it (settler), and a drain reaches it (drain, lifecycle).
