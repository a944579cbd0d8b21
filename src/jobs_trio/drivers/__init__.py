# Storage drivers, one module each; `open_driver` picks one by URL scheme.
