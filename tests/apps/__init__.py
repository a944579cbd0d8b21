# Job modules that tests import by name, as `jobs-trio worker MODULE` and `enqueue --app` do.
