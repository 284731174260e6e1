"""The SQL store: tables, engine and the data functions the training loop uses."""
