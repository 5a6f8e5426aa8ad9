"""The host socket: where agent hosts (and the CLI) talk to the daemon."""
