# The application's transaction, the outbox and the relay.
