"""Helpers every layer may use: host facts, byte sizes, figures, loopback sockets, tracebacks."""
