"""Sans-IO protocol state machines, one subpackage per protocol family. Import no zmq."""
