# Job bodies: steps, context, tracing, the enqueue boundary.
