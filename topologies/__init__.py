"""Topology files, the local launcher, the Spark runtime and the command line."""
