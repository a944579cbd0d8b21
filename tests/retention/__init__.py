# Retention.
