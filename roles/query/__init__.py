"""Query execution (Hazelcast Mustang): plans, operators, initiator and participant."""
