"""Segment replication (EventQL): segment store, partition leader and follower."""
