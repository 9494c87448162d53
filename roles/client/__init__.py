"""Thin client (IEP-90): address list, cluster identity, retries, logical connection restore."""
