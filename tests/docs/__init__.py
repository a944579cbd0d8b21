# The docs and the public surface.
