# The bottom layer: values, errors, rules and the plumbing every other wing shares (logs,
# metrics, tracing). Apart because nothing here imports a wing above it.
