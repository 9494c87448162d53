"""ZeroMQ sockets, sessions, liveness, credit streams and the node loop. Imports no role."""
