"""Compute control (Materialize): controller, replica, command history, dataflows."""
